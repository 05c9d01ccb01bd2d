"""Trace stage: a cache of dispatched calls by their arguments' metadata, and how their outputs were made.

A decoder stack runs the same few hundred (op, argument metadata) combinations once per layer. The key is
what decides a fake or meta result: the op; each tensor's dtype, shape, stride, storage offset, device,
requires_grad and conj/neg bits; every other argument's value; the default dtype and device, grad and
inference mode. The entry says how each output was made: an input returned as it is (in-place, out=), a view
of an input's storage, a fresh tensor, or None; a hit rebuilds them without running the kernel.

Not served (the call runs as usual): the ops FakeTensorMode never caches itself (data-dependent or dynamic
output shapes, in-place metadata changes, lifts, non-aten ops; but `_unsafe_view`, whose output shares its
input's storage without being a view, is rebuilt like a view here), arguments a key cannot hold (symbolic
sizes, generators, tensors the cache does not own), and results it could not rebuild exactly (a resized out=
tensor, a fresh tensor in a larger storage, outputs sharing a storage).

`CallCache` is the mechanism; fast_fake.FakeCache serves the fake tensors of one FakeTensorMode, `MetaCache`
plain meta tensors (the memory estimate's sizing runs, whose meta kernels are mostly Python).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_NO = object()  # "not cacheable" (as a key part, or as a cache entry)
_PLAIN = (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_BYPASS_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape, torch.Tag.inplace_view)
_aten = torch.ops.aten
_BYPASS_OPS = frozenset({torch.ops.prims.as_strided.default, _aten.lift.default, _aten.lift_fresh.default,
                         _aten.lift_fresh_copy.default, _aten.to_mkldnn.default})


@dataclass(frozen=True)
class Out:
    """How one output is rebuilt: `kind` "same" (input `index` itself), "view" (of input `index`'s
    storage), "fresh" or "none"; `meta` is (shape, stride, offset, dtype, device, requires_grad, conj, neg)."""

    kind: str
    index: int = -1
    meta: tuple = ()


@dataclass(frozen=True)
class CachedCall:
    """A cached call: its outputs, and whether they came as one tensor, a tuple or a list."""

    outs: tuple[Out, ...]
    container: type | None  # None: a single output


class CallCache:
    """The cache itself: key, entry and rebuild (see the module docstring), for one kind of tensor.

    `call(func, args, kwargs, run)` serves a repeated call, or runs `run()` (the real dispatch) and remembers
    how its outputs were made. Subclasses say which tensors may take part in a key (`owns`), what their
    device is and how a rebuilt plain meta tensor becomes one of theirs (`wrap`)."""

    def __init__(self):
        self.entries: dict[tuple, CachedCall | object] = {}
        self.hits = 0

    def owns(self, t) -> bool:
        """True for a tensor this cache can describe and rebuild."""
        raise NotImplementedError

    def device(self, t):
        """The device a rebuilt tensor must report."""
        raise NotImplementedError

    def wrap(self, empty: torch.Tensor, device):
        """The rebuilt plain meta tensor as this cache's kind of tensor."""
        raise NotImplementedError

    def call(self, func, args, kwargs, run, check=None):
        """The call's outputs: rebuilt from the cache (then `check(out, inputs)` when given), else `run()`."""
        key = self.key(func, args, kwargs) if _cacheable(func) else None
        if key is None:
            return run()
        entry = self.entries.get(key)
        if entry is None:
            inputs = _tensors(args, kwargs)
            before = [self.tensor_key(t) for t in inputs]
            out = run()
            self.entries[key] = self._entry(out, inputs, before)
            return out
        if entry is _NO:
            return run()
        self.hits += 1
        inputs = _tensors(args, kwargs)
        out = self._rebuild(entry, inputs)
        if check is not None:
            check(out, inputs)
        return out

    def key(self, func, args, kwargs) -> tuple | None:
        """The call's cache key, or None when an argument cannot be part of one."""
        parts = [id(func), torch.get_default_dtype(), torch._C._get_default_device(), torch.is_grad_enabled(),
                 torch.is_inference_mode_enabled()]  # id: _cacheable_ops holds every func keyed here
        for value in args:
            part = self._arg_key(value)
            if part is _NO:
                return None
            parts.append(part)
        for name, value in kwargs.items():
            part = self._arg_key(value)
            if part is _NO:
                return None
            parts.append((name, part))
        return tuple(parts)

    def tensor_key(self, t) -> tuple | object:
        """What decides a tensor argument's part in a result, or _NO."""
        if not self.owns(t):
            return _NO
        return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), self.device(t), t.requires_grad,
                t.is_conj(), t.is_neg())

    def _arg_key(self, value):
        if isinstance(value, torch.Tensor):
            return self.tensor_key(value)
        if value is None:
            return None
        if isinstance(value, _PLAIN):
            if type(value) is float and math.isnan(value):
                return _NO  # nan != nan: it would never hit
            return (type(value), value)
        if isinstance(value, (list, tuple)):
            parts = tuple(self._arg_key(v) for v in value)
            return _NO if any(p is _NO for p in parts) else (type(value), parts)
        return _NO  # SymInt, Generator, ...

    def _rebuild(self, entry: CachedCall, inputs: list):
        outs = [self._output(out, inputs) for out in entry.outs]
        return outs[0] if entry.container is None else entry.container(outs)

    def _output(self, out: Out, inputs: list):
        if out.kind == "none":
            return None
        if out.kind == "same":
            return inputs[out.index]
        shape, stride, offset, dtype, device, requires_grad, conj, neg = out.meta
        with torch._C.DisableTorchFunction():  # a plain meta tensor: no mode is active in here
            empty = torch.empty_strided(shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad)
            if conj:
                torch._C._set_conj(empty, True)
            if neg:
                torch._C._set_neg(empty, True)
            if out.kind == "view":
                empty.set_(inputs[out.index].untyped_storage(), offset, shape, stride)
        return self.wrap(empty, device)

    def _entry(self, out, inputs: list, before: list) -> CachedCall | object:
        container = type(out) if type(out) in (tuple, list) else None
        outs = []
        fresh_storages: set[int] = set()
        for value in (out if container else (out,)):
            found = self._out(value, inputs, before, fresh_storages)
            if found is _NO:
                return _NO
            outs.append(found)
        return CachedCall(tuple(outs), container)

    def _out(self, value, inputs: list, before: list, fresh_storages: set) -> Out | object:
        if value is None:
            return Out("none")
        if self.tensor_key(value) is _NO:
            return _NO
        same = next((i for i, t in enumerate(inputs) if t is value), None)
        if same is not None:  # in-place or out=: only when its metadata did not change (no resize)
            return Out("same", same) if self.tensor_key(value) == before[same] else _NO
        meta = (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, self.device(value),
                value.requires_grad, value.is_conj(), value.is_neg())
        storage = value.untyped_storage()
        view = next((i for i, t in enumerate(inputs) if t.untyped_storage()._cdata == storage._cdata), None)
        if view is not None:
            return Out("view", view, meta)
        if meta[2] != 0 or storage._cdata in fresh_storages or storage.nbytes() != _bytes_needed(value):
            return _NO  # a fresh tensor empty_strided would not rebuild exactly
        fresh_storages.add(storage._cdata)
        return Out("fresh", -1, meta)


class MetaCache(CallCache):
    """The cache for plain meta tensors (the memory estimate's sizing runs): what their meta kernels return,
    rebuilt without running the kernels again (most are Python code, `torch._refs` and `torch._prims`)."""

    def owns(self, t) -> bool:
        """Plain (or Parameter) strided meta tensors with concrete sizes."""
        return type(t) in _PLAIN_TENSORS and t.is_meta and not t._has_symbolic_sizes_strides \
            and t.layout == torch.strided

    def device(self, t):
        """meta."""
        return t.device

    def wrap(self, empty: torch.Tensor, device):
        """The rebuilt tensor itself."""
        return empty


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


_cacheable_ops: dict[int, tuple] = {}  # id(func) -> (func, cacheable): it holds func, so no id is ever reused


def _cacheable(func) -> bool:
    """The ops FakeTensorMode itself caches (its _validate_cache_key), decided once per op (by id: no
    OpOverload.__hash__ on every call)."""
    known = _cacheable_ops.get(id(func))
    if known is None or known[0] is not func:
        known = _cacheable_ops[id(func)] = (func, (
            isinstance(func, torch._ops.OpOverload) and func.namespace in ("aten", "prims")
            and func not in _BYPASS_OPS and not any(tag in func.tags for tag in _BYPASS_TAGS)
            and not (func.is_view and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd))))
    return known[1]


def _tensors(args, kwargs) -> list:
    out = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _bytes_needed(t) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))) * t.element_size()
