"""Trace stage: a FakeTensorMode whose repeated calls are cheap (what makes a 70B step scan in seconds).

A decoder stack runs the same few hundred (op, argument metadata) combinations once per layer.
FakeTensorMode caches those too, but keys each call by extracting every argument's full metadata
and rebuilds outputs through generic checks, which costs more than the rest of opscan's recording.
`FastFakeMode` puts a smaller cache in front of it. The key is what decides a fake result: the op;
each tensor's dtype, shape, stride, storage offset, device, requires_grad and conj/neg bits; every
other argument's value; the default dtype and device, grad and inference mode. The entry says how
each output was made: an input returned as it is (in-place, out=), a view of an input's storage,
a fresh tensor, or None.

Everything else goes to FakeTensorMode unchanged: first calls, the ops it never caches itself
(data-dependent or dynamic output shapes, in-place metadata changes, lifts, non-aten ops; but
`_unsafe_view`, whose output shares its input's storage without being a view, is rebuilt like a
view here), fake constants (AdamW's step counters), symbolic sizes, real tensors, and results this
cache could not rebuild exactly (a resized out= tensor, a fresh tensor in a larger storage, outputs
sharing a storage). `crosscheck=True` also runs FakeTensorMode on every hit and compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

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
class Entry:
    """A cached call: its outputs, and whether they came as one tensor, a tuple or a list."""

    outs: tuple[Out, ...]
    container: type | None  # None: a single output


class CallCache:
    """The cache itself: key, entry and rebuild (see the module docstring), for one kind of tensor.

    `call(func, args, kwargs, run)` serves a repeated call, or runs `run()` (the real dispatch) and remembers
    how its outputs were made. Subclasses say which tensors may take part in a key (`owns`), what their
    device is and how a rebuilt plain meta tensor becomes one of theirs (`wrap`)."""

    def __init__(self):
        self.entries: dict[tuple, Entry | object] = {}
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
        parts = [func, torch.get_default_dtype(), torch._C._get_default_device(), torch.is_grad_enabled(),
                 torch.is_inference_mode_enabled()]
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

    def _rebuild(self, entry: Entry, inputs: list):
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

    def _entry(self, out, inputs: list, before: list) -> Entry | object:
        container = type(out) if type(out) in (tuple, list) else None
        outs = []
        fresh_storages: set[int] = set()
        for value in (out if container else (out,)):
            found = self._out(value, inputs, before, fresh_storages)
            if found is _NO:
                return _NO
            outs.append(found)
        return Entry(tuple(outs), container)

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


class FakeCache(CallCache):
    """The cache for the fake tensors of one FakeTensorMode (not constants, symbolic or subclass originals)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def owns(self, t) -> bool:
        """(dispatch_keys is set for mkldnn and subclass originals; FakeTensor.is_mkldnn is slow)"""
        return not (type(t) is not FakeTensor or t.fake_mode is not self.mode or t.constant is not None
                    or t._has_symbolic_sizes_strides or t.is_sparse or t.dispatch_keys is not None)

    def device(self, t):
        """The fake device (the meta storage underneath is not what the tensor reports)."""
        return t.fake_device

    def wrap(self, empty: torch.Tensor, device):
        """A FakeTensor of the mode over the rebuilt meta tensor."""
        return FakeTensor(self.mode, empty, device)


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


class FastFakeMode(FakeTensorMode):
    """FakeTensorMode with the cache described in the module docstring."""

    def __init__(self, *, crosscheck: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.crosscheck = crosscheck
        self.cache = FakeCache(self)

    @property
    def hits(self) -> int:
        """Calls served from the cache so far."""
        return self.cache.hits

    def dispatch(self, func, types, args=(), kwargs=None):
        """FakeTensorMode's result (see _cached), with the CPU kernel's statistics dtype for mixed layer norm."""
        out = self._cached(func, types, args, kwargs or {})
        return self._mixed_layer_norm(args, out) if func is _LAYER_NORM else out

    def _mixed_layer_norm(self, args, out):
        """layer_norm_cpu keeps mean and rstd in the parameters' float32 when a bfloat16/float16 input
        meets float32 weights (autocast); torch's fake kernel gives them the input's dtype.
        (aten/src/ATen/native/layer_norm.cpp: param_scalar_type(input, is_mixed_type(...)))"""
        x, params = args[0], [t for t in args[2:4] if isinstance(t, torch.Tensor)]  # weight, bias
        mixed = x.dtype in (torch.bfloat16, torch.float16) and params and all(
            t.dtype == torch.float32 for t in params)
        if not mixed or getattr(x, "fake_device", x.device).type != "cpu":
            return out
        y, mean, rstd = out
        return y, self._retyped(mean, torch.float32), self._retyped(rstd, torch.float32)

    def _retyped(self, t, dtype):
        if t.dtype == dtype:
            return t
        with torch._C.DisableTorchFunction():
            empty = torch.empty_strided(tuple(t.shape), t.stride(), dtype=dtype, device="meta")
        return FakeTensor(self, empty, t.fake_device)

    def _cached(self, func, types, args, kwargs):
        """Serve a repeated call from the cache; otherwise FakeTensorMode's dispatch, remembered."""
        run = lambda: super(FastFakeMode, self).dispatch(func, types, args, kwargs)  # noqa: E731
        check = (lambda out, inputs: _compare(out, run(), inputs, func)) if self.crosscheck else None
        return self.cache.call(func, args, kwargs, run, check)


_LAYER_NORM = _aten.native_layer_norm.default
_cacheable_ops: dict = {}


def _cacheable(func) -> bool:
    """The ops FakeTensorMode itself caches (its _validate_cache_key), decided once per op."""
    known = _cacheable_ops.get(func)
    if known is None:
        known = _cacheable_ops[func] = (
            isinstance(func, torch._ops.OpOverload) and func.namespace in ("aten", "prims")
            and func not in _BYPASS_OPS and not any(tag in func.tags for tag in _BYPASS_TAGS)
            and not (func.is_view and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd)))
    return known


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


def _compare(mine, theirs, inputs: list, func) -> None:
    """crosscheck: the rebuilt outputs must match FakeTensorMode's in metadata and aliasing."""
    pairs = list(zip(mine, theirs)) if isinstance(mine, (tuple, list)) else [(mine, theirs)]
    for a, b in pairs:
        if (a is None) != (b is None):
            raise AssertionError(f"fast fake cache: {func} returned {a!r}, FakeTensorMode {b!r}")
        if a is not None and _described(a, inputs) != _described(b, inputs):
            raise AssertionError(f"fast fake cache: {func} gave {_described(a, inputs)}, "
                                 f"FakeTensorMode {_described(b, inputs)}")


def _described(t, inputs: list) -> tuple:
    alias = next((("same", i) for i, x in enumerate(inputs) if x is t), None) or next(
        (("view", i) for i, x in enumerate(inputs) if x.untyped_storage()._cdata == t.untyped_storage()._cdata),
        ("fresh",))
    return (alias, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, t.requires_grad,
            t.is_conj(), t.is_neg())
