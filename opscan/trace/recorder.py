"""Trace stage: the TorchDispatchMode that records every dispatched call.

One small mode with one job, in the manner of torch/utils/flop_counter.py: for every call it
stores the OpKey, the phase, the module that caused it, the metadata of each tensor argument and
result (dtype, shape, stride, device, storage identity, bytes) and its non-tensor arguments.
Composite ops that have no MPS kernel of their own can be expanded: the op is re-dispatched to its
CompositeExplicitAutograd kernel inside the (re-entered) mode, so its callees are recorded too,
marked with the composite call as their parent.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Callable

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from opscan.opkey import OpKey
from opscan.trace.argspec import encode as encode_args
from opscan.trace.attribution import GradFnMapper, ModuleTracker, PhaseTracker, backward_module
from opscan.trace.bookkeeping import is_bookkeeping
from opscan.trace.frames import Sites
from opscan.trace.guard import call_through
from opscan.trace.host import name_before_step
from opscan.trace.hooks import run_composite
from opscan.trace.records import OpCall, TensorMeta
from opscan.trace.scalars import rewrapped
from opscan.trace.tensors import StorageIds, describe, tensors_in

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_DEVICE_QUERY = torch.ops.prim.device.default  # dispatched only by tensors with a Python device (fake)

MAX_EXPANSION_DEPTH = 4


class CallRecorder(TorchDispatchMode):
    """Records each call as an `OpCall`; `fx_node` is set from outside while an fx node runs.

    `expand(op)` says whether a call should be re-dispatched to its CompositeExplicitAutograd
    kernel so that its callees are recorded (used for composites without an MPS kernel).
    """

    def __init__(self, tracker: ModuleTracker, mapper: GradFnMapper, phases: PhaseTracker,
                 expand: Callable[[OpKey], bool] | None = None):
        super().__init__()
        self.tracker, self.mapper, self.phases = tracker, mapper, phases
        self.expand = expand or (lambda op: False)
        self._expands: dict[int, bool] = {}  # id(func) -> expand(its OpKey), asked once per operator
        self.storages = StorageIds()
        self.param_storages: dict[int, str] = {}
        self.calls: list[OpCall] = []
        self.fx_node: str | None = None
        self._last_phase = ""
        self._parents: list[int] = []
        self._params: list = []
        self.below = None  # the memory tracker, handed every call this mode passes on (its `observe`)
        self.event_marks: list[int] | None = None  # per call, the tracker's events before it (repeat.py)
        self._muted = False
        self.sites = Sites()  # the calling places (py chain, caller, the user's line), each kept once
        self._parent_site: tuple = ((), None, None)  # the site of the last top-level call (its callees share it)
        self._made_from: list[tuple[int, ...]] = []  # the host sources of the calls running now, innermost last

    def index_parameters(self, model: torch.nn.Module) -> None:
        """Remember parameter storages so optimizer calls can be attributed to their module."""
        self._params = [(p, owner) for p in model.parameters()
                        if (owner := self.tracker.param_owner.get(id(p))) is not None]
        for param, owner in self._params:
            self.param_storages.setdefault(self.storages.of(param), owner)

    def index_placement(self, model: torch.nn.Module, inputs, functions=(), on_device=()) -> None:
        """Tell the trace which tensors the step is given — parameters, buffers, inputs and the tensors the target
        says its own code moves (`on_device`): those a user moves to MPS — so it can tell the tensors that stay on
        the host (trace/tensors.py StoragePlaces), and name those that existed before it (trace/host.py; the
        target's hook `functions` are searched for the globals and closures they use)."""
        placement = self.storages.placement
        for t in (*model.parameters(), *model.buffers(), *tensors_in(inputs), *tensors_in(on_device)):
            offset = t.storage_offset()
            placement.give(self.storages.of(t), offset if type(offset) is int else 0)
        for t, named in name_before_step(model, functions):
            sid = self.storages.of(t)
            if sid >= 0 and sid not in placement.given:
                placement.named.setdefault(sid, named)

    def _index_gradients(self) -> None:
        for param, owner in self._params:
            if param.grad is not None:
                self.param_storages[self.storages.of(param.grad)] = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._muted:
            return self._through(func, args, kwargs)
        if func is _DEVICE_QUERY:  # a fake tensor asking its device through the dispatcher: no call
            return _device_query(func, args, kwargs)
        op = _facts(func)
        if op is None:
            return self._decomposed(func, args, kwargs)
        wrapped = rewrapped(func, args, kwargs)  # a composite's wrapped scalar, come back as a number
        if wrapped[0] is not args or wrapped[1] is not kwargs:
            self._not_placed(tensors_in(args, kwargs), tensors_in(*wrapped))
        args, kwargs = wrapped
        phase = self.phases.current()
        # a composite's callee, re-dispatched by this mode, was issued where its composite was
        site = self._site(sys._getframe(1)) if not self._parents else self._parent_site
        if phase == "optimizer" and self._last_phase != "optimizer":
            self._index_gradients()
        self._last_phase = phase
        ins = tensors_in(args, kwargs)
        self.storages.placement.site = site[2]  # a host tensor first met here is named by this line
        inputs = self._metas(ins)
        index = len(self.calls)
        spec = encode_args(args, kwargs)  # before the call: an in-place op changes its inputs
        self.calls.append(None)  # reserve the slot so callees come after their composite
        if self.event_marks is not None:
            self.event_marks.append(self.below.events_now())
        # what the call makes is on the host when its tensor arguments all are; a callee with none (the empty a
        # composite allocates its result with, from self's options) where its composite's are
        made_from = _host_roots(inputs) if inputs and all(t.host for t in inputs) else (
            self._made_from[-1] if not inputs and self._made_from else ())
        self._made_from.append(made_from)
        try:
            out, expanded = self._execute(func, op, index, args, kwargs, ins)
        except Exception as exc:  # the step may catch it ("try float16, else float32"): keep the call
            self._store(index, op, phase, inputs, (), args, kwargs, spec, False, f"{type(exc).__name__}: {exc}", site)
            raise
        finally:
            self._made_from.pop()
        outputs = tuple(describe(t, self.storages, made_from) for t in tensors_in(out))
        self._store(index, op, phase, inputs, outputs, args, kwargs, spec, expanded, None, site)
        return out

    def _not_placed(self, before, after) -> None:
        """The scalars a composite wrapped as tensors: 0-dim CPU tensors on every device, as PyTorch itself passes
        them to the kernels of the Tensor overload (the CPU trace ran the same composite), not tensors the user's
        code placed: on the host, with no source of their own (the placement model judges only sourced ones)."""
        placement = self.storages.placement
        if placement.tracking:
            for t in after:
                if all(t is not b for b in before):
                    sid = self.storages.of(t)
                    placement.made.add(sid)
                    placement.host.add(sid)

    def _site(self, frame) -> tuple:
        """(py chain, caller, CallSite) of a call, interned: calls from one place share one tuple."""
        self._parent_site = self.sites.of(frame)
        return self._parent_site

    def note_call(self, op: OpKey, raised: str, args=(), kwargs=None) -> None:
        """Record a call this mode did not see as one that raised `raised`, in the current phase and module: a
        Python API that raises on a Mac (no arguments), or a composite that refused its arguments before it
        dispatched anything (trace/amp.py)."""
        kwargs = kwargs or {}
        self.calls.append(None)
        if self.event_marks is not None:
            self.event_marks.append(self.below.events_now())
        spec = encode_args(args, kwargs) if args or kwargs else None
        site = self._site(sys._getframe(1))
        self._store(len(self.calls) - 1, op, self.phases.current(), self._metas(tensors_in(args, kwargs)), (), args,
                    kwargs, spec, False, raised, site)

    @contextlib.contextmanager
    def muted(self):
        """Pass calls on without recording them (a call run again in float32 after the CPU refused it: amp.py)."""
        self._muted = True
        try:
            yield
        finally:
            self._muted = False

    def _store(self, index, op, phase, inputs, outputs, args, kwargs, spec, expanded, raised,
               site=((), None, None)) -> None:
        module, how = self._module(phase, inputs)
        if how == "parameter" and phase == "optimizer":
            for t in outputs:  # optimizer state made from a parameter belongs to its module
                self.param_storages.setdefault(t.storage, module)
        attrs = tuple([_attr(x) for x in args] + [_attr(x) for x in kwargs.values()]) if kwargs \
            else tuple([_attr(x) for x in args])
        self.calls[index] = OpCall(
            index, op, phase, module, inputs, outputs, is_bookkeeping(op),
            self.fx_node if phase == "forward" else None, how, _current_node(),
            self._parents[-1] if self._parents else None, expanded, attrs, spec, raised, site[0], site[1],
            self.sites.where(phase, site[2]))

    def _through(self, func, args, kwargs, ins=None):
        """The call as the modes below (the memory tracker, a fake mode) and the kernels run it."""
        if self.below is None:
            return call_through(func, *args, **kwargs)
        return self.below.observe(func, args, kwargs, ins)

    def _expands_op(self, func, op: OpKey) -> bool:
        found = self._expands.get(id(func))
        if found is None:
            found = self._expands[id(func)] = bool(self.expand(op))
        return found

    def _execute(self, func, op: OpKey, index: int, args, kwargs, ins=None):
        if len(self._parents) >= MAX_EXPANSION_DEPTH or not self._expands_op(func, op):
            return self._through(func, args, kwargs, ins), False
        if _is_view(func):  # a composite view only rewrites metadata: no callee dispatches
            return self._through(func, args, kwargs), True
        key = _composite_key(func)
        if key is None:
            return self._through(func, args, kwargs), False
        self._parents.append(index)
        try:
            try:
                with self:
                    out = func._op_dk(key, *args, **kwargs)
            except Exception:  # noqa: BLE001 - the composite kernel refused these arguments
                del self.calls[index + 1:]  # (e.g. a Python scalar the C++ schema wants as a Tensor)
                if self.event_marks is not None:
                    del self.event_marks[index + 1:]
                return self._through(func, args, kwargs), False
            if len(self.calls) == index + 1:  # a CPU fast path dispatched nothing: see the device path
                # nothing dispatched on meta either: metadata only; the meta run failed: not known
                expanded = self._expand_on_meta(func, key, args, kwargs)
                if _strayed(out, args, kwargs) and not func._schema.is_mutable:
                    out = self._through(func, args, kwargs)  # C++ made a plain meta tensor of a fake one
                return out, expanded
            return out, True
        finally:
            self._parents.pop()

    def _expand_on_meta(self, func, key, args, kwargs) -> bool:
        """Run the composite kernel on meta copies: its non-CPU branch (the one MPS takes) dispatches.
        True when that run succeeded. Under fake tensors the copies are plain meta tensors too (the fake
        mode is set aside for the run), as in a real trace."""
        outside_fake = unset_fake_temporarily() if _has_fake((args, kwargs)) else contextlib.nullcontext()
        with outside_fake:
            meta_args, meta_kwargs = tree_map(_to_meta, (args, kwargs))
            if "device" in meta_kwargs:
                meta_kwargs["device"] = torch.device("meta")
            try:
                with self:
                    func._op_dk(key, *meta_args, **meta_kwargs)
            except Exception:  # noqa: BLE001 - no meta path: the callees stay unknown
                return False
        return True

    @property
    def expanding(self) -> bool:
        """True while a composite is re-dispatched to record its callees."""
        return bool(self._parents)

    def _decomposed(self, func, args, kwargs):
        # Under inference_mode the autograd keys are skipped, so CompositeImplicitAutograd ops
        # (aten::linear, aten::conv2d, ...) reach this mode whole; record what they run instead,
        # as in training, the lens's ops through the lens (hooks.py). The C++ kernel only: Python
        # decompositions are not what eager runs.
        with self:
            return run_composite(func, args, kwargs)

    def _module(self, phase: str, inputs: tuple[TensorMeta, ...]) -> tuple[str, str]:
        current = self.tracker.current
        if current is not None:
            return current, "hooks"
        if phase == "backward":
            found = backward_module(self.mapper, self.tracker)
            if found is not None:
                return found
        owners = {self.param_storages[t.storage] for t in inputs if t.storage in self.param_storages}
        if len(owners) == 1:
            return owners.pop(), "parameter"
        return "", "none"

    def _metas(self, tensors) -> tuple[TensorMeta, ...]:
        return tuple(describe(t, self.storages) for t in tensors)


def _host_roots(inputs) -> tuple[int, ...]:
    """The host sources of a call whose tensor arguments are all on the host (its results come from them)."""
    if len(inputs) == 1:
        return inputs[0].host_from
    return tuple(sorted({r for t in inputs for r in t.host_from}))


_FACTS: dict[int, tuple] = {}  # id(func) -> (func, its OpKey or None for a composite): no OpOverload.__hash__


def _facts(func) -> OpKey | None:
    """OpKey.of(func), once per operator; None when the C++ composite kernel is what runs (_is_composite)."""
    found = _FACTS.get(id(func))
    if found is None or found[0] is not func:
        found = _FACTS[id(func)] = (func, None if _is_composite(func) else OpKey.of(func))
    return found[1]


@functools.lru_cache(maxsize=None)
def _composite_key(func) -> DispatchKey | None:
    """The composite key the op really has a kernel for (calling a missing one would crash)."""
    for key in (DispatchKey.CompositeExplicitAutograd, DispatchKey.CompositeExplicitAutogradNonFunctional):
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
            return key
    return None


@functools.lru_cache(maxsize=None)
def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _current_node() -> int | None:
    node = torch._C._current_autograd_node()
    return None if node is None else int(node._sequence_nr())


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _attr(value):
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return "<tensor>"
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_attr(v) for v in value]
    return type(value).__name__


@functools.lru_cache(maxsize=None)
def _is_composite(func) -> bool:
    """True for an op whose C++ CompositeImplicitAutograd kernel is what runs when it reaches us."""
    name = getattr(func, "name", None)
    try:
        return callable(name) and torch._C._dispatch_has_kernel_for_dispatch_key(name(), _COMPOSITE)
    except RuntimeError:  # an op the dispatcher does not know by name (prim::device)
        return False


def _device_query(func, args, kwargs):
    """prim::device of a fake tensor, answered as FakeTensorMode's handler would (saves a dispatch)."""
    x = args[0] if len(args) == 1 else None
    if isinstance(x, FakeTensor):
        return torch.device("meta") if x.fake_mode.in_kernel_invocation else x.fake_device
    return func(*args, **kwargs)


def _has_fake(value) -> bool:
    return any(isinstance(t, FakeTensor) for t in tensors_in(value))


def _strayed(out, args, kwargs) -> bool:
    """True when a composite's C++ fast path, run on fake tensors, returned a plain (meta) tensor:
    it built a new tensor from the fake one's storage without dispatching, outside the fake mode."""
    if not _has_fake((args, kwargs)):
        return False
    return any(not isinstance(t, FakeTensor) for t in tensors_in(out))
