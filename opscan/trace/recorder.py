"""Trace stage: the TorchDispatchMode that records every dispatched call.

One small mode with one job, in the manner of torch/utils/flop_counter.py: for every call it
stores the OpKey, the phase, the module that caused it, the metadata of each tensor argument and
result (dtype, shape, stride, device, storage identity, bytes) and its non-tensor arguments.
Composite ops that have no MPS kernel of their own can be expanded: the op is re-dispatched to its
CompositeExplicitAutograd kernel inside the (re-entered) mode, so its callees are recorded too,
marked with the composite call as their parent (expansion.py).

It runs for every call, so its per-call path is short: what depends on the operator alone is worked out once per
operator (plans.py), the arguments are walked once for their tensors, display and replayable forms
(argspec.read_call), each tensor's metadata is read once (tensors.describe), and the memory tracker below is handed
the tensors already found (memory/tracker.py `run`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from opscan.opkey import OpKey
from opscan.trace.argspec import attrs as attrs_of, encode as encode_args, read_call
from opscan.trace.attribution import GradFnMapper, ModuleTracker, PhaseTracker, backward_module
from opscan.trace.bookkeeping import is_bookkeeping
from opscan.trace.expansion import run_expanded
from opscan.trace.frames import Sites
from opscan.trace.guard import call_through
from opscan.trace.host import name_before_step
from opscan.trace.hooks import run_composite
from opscan.trace.plans import PLANS, plan_of
from opscan.trace.records import OpCall, TensorMeta, recorded_call
from opscan.trace.scalars import numbers_in, rewrapped
from opscan.trace.tensors import StorageIds, describe, tensors_in

_current_autograd_node = torch._C._current_autograd_node

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
        self.parents: list[int] = []  # the composite calls being expanded now (expansion.py), innermost last
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
            return self.through(func, args, kwargs)
        plan = PLANS.get(id(func))
        if plan is None or plan.func is not func:
            plan = plan_of(func)
        op = plan.op
        if op is None:
            if plan.device_query:  # a fake tensor asking its device through the dispatcher: no call
                return _device_query(func, args, kwargs)
            return self._decomposed(func, args, kwargs)
        if plan.numbers_at or plan.numbers_named:  # a composite's wrapped scalar may come back as a number
            args, kwargs = self._rewrapped(plan, args, kwargs)
        node = _current_autograd_node()  # (read once: the call's phase, backward module, sequence number and site)
        phase = self.phases.at(node)
        # a composite's callee, re-dispatched by this mode, was issued where its composite was
        if self.parents:
            site = self._parent_site
        else:
            site = self._parent_site = self.sites.of(sys._getframe(1))
        if phase == "optimizer" and self._last_phase != "optimizer":
            self._index_gradients()
        self._last_phase = phase
        # before the call: an in-place op changes its inputs
        ins, shown, spec = read_call(args, kwargs)
        _drop_values(spec, plan)
        storages = self.storages
        storages.placement.site = site[2]  # a host tensor first met here is named by this line
        inputs = tuple([describe(t, storages) for t in ins])
        calls = self.calls
        index = len(calls)
        calls.append(None)  # reserve the slot so callees come after their composite
        if self.event_marks is not None:
            self.event_marks.append(self.below.events_now())
        # what the call makes is on the host when its tensor arguments all are; a callee with none (the empty a
        # composite allocates its result with, from self's options) where its composite's are
        made_from = _sources_of(inputs, self._made_from)
        self._made_from.append(made_from)
        try:
            out, outs, expanded = self._run(func, plan, index, args, kwargs, ins)
        except Exception as exc:  # the step may catch it ("try float16, else float32"): keep the call
            self._store(index, op, phase, inputs, (), shown, spec, False, f"{type(exc).__name__}: {exc}", site,
                        plan.bookkeeping, node)
            raise
        finally:
            self._made_from.pop()
        outputs = tuple([describe(t, storages, made_from) for t in outs])
        self._store(index, op, phase, inputs, outputs, shown, spec, expanded, None, site, plan.bookkeeping, node)
        return out

    def _run(self, func, plan, index: int, args, kwargs, ins) -> tuple[object, list, bool]:
        """(the call's result, its tensors, whether its callees were recorded): run by the modes below and the
        kernels, or expanded (expansion.py)."""
        expands = self._expands.get(id(func))
        if expands is None:
            expands = self._expands_op(func, plan.op)
        if not expands or len(self.parents) >= MAX_EXPANSION_DEPTH:
            if self.below is None:
                out = call_through(func, *args, **kwargs)
                return out, tensors_in(out), False
            return (*self.below.run(func, args, kwargs, ins, plan.grows), False)
        out, expanded = run_expanded(self, func, index, args, kwargs)
        return out, tensors_in(out), expanded

    def _rewrapped(self, plan, args, kwargs) -> tuple[tuple, dict]:
        """The call's arguments with the numbers in its Tensor parameters made tensors again (scalars.py)."""
        if not numbers_in(plan.numbers_at, plan.numbers_named, args, kwargs):
            return args, kwargs
        wrapped = rewrapped(plan.func, args, kwargs)
        self._not_placed(tensors_in(args, kwargs), tensors_in(*wrapped))
        return wrapped

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

    def note_call(self, op: OpKey, raised: str, args=(), kwargs=None) -> None:
        """Record a call this mode did not see as one that raised `raised`, in the current phase and module: a
        Python API that raises on a Mac (no arguments), or a composite that refused its arguments before it
        dispatched anything (trace/amp.py)."""
        kwargs = kwargs or {}
        self.calls.append(None)
        if self.event_marks is not None:
            self.event_marks.append(self.below.events_now())
        spec = encode_args(args, kwargs) if args or kwargs else None
        site = self._parent_site = self.sites.of(sys._getframe(1))
        node = _current_autograd_node()
        phase = self.phases.at(node)
        inputs = tuple([describe(t, self.storages) for t in tensors_in(args, kwargs)])
        self._store(len(self.calls) - 1, op, phase, inputs, (), attrs_of(args, kwargs), spec, False, raised, site,
                    is_bookkeeping(op), node)

    @contextlib.contextmanager
    def muted(self):
        """Pass calls on without recording them (a call run again in float32 after the CPU refused it: amp.py)."""
        self._muted = True
        try:
            yield
        finally:
            self._muted = False

    def _store(self, index, op, phase, inputs, outputs, shown, spec, expanded, raised, site, bookkeeping,
               node) -> None:
        """Record the call at `index` (`node`: the autograd node running it, or None)."""
        module, how = self._module(phase, inputs, node)
        if how == "parameter" and phase == "optimizer":
            for t in outputs:  # optimizer state made from a parameter belongs to its module
                self.param_storages.setdefault(t.storage, module)
        parents = self.parents
        self.calls[index] = recorded_call(
            index, op, phase, module, inputs, outputs, bookkeeping, self.fx_node if phase == "forward" else None, how,
            None if node is None else int(node._sequence_nr()), parents[-1] if parents else None, expanded, shown,
            spec, raised, site[0], site[1], self.sites.where(phase, site[2], node))

    def through(self, func, args, kwargs):
        """The call as the modes below (the memory tracker, a fake mode) and the kernels run it."""
        if self.below is None:
            return call_through(func, *args, **kwargs)
        return self.below.observe(func, args, kwargs)

    def _expands_op(self, func, op: OpKey) -> bool:
        found = self._expands.get(id(func))
        if found is None:
            found = self._expands[id(func)] = bool(self.expand(op))
        return found

    @property
    def expanding(self) -> bool:
        """True while a composite is re-dispatched to record its callees."""
        return bool(self.parents)

    def _decomposed(self, func, args, kwargs):
        # Under inference_mode the autograd keys are skipped, so CompositeImplicitAutograd ops
        # (aten::linear, aten::conv2d, ...) reach this mode whole; record what they run instead,
        # as in training, the lens's ops through the lens (hooks.py). The C++ kernel only: Python
        # decompositions are not what eager runs.
        with self:
            return run_composite(func, args, kwargs)

    def _module(self, phase: str, inputs: tuple[TensorMeta, ...], node) -> tuple[str, str]:
        stack = self.tracker.stack
        if stack:
            return stack[-1], "hooks"
        if phase == "backward":
            found = backward_module(self.mapper, self.tracker, node)
            if found is not None:
                return found
        owner = None
        params = self.param_storages
        for t in inputs:  # the one module that owns the parameters read, if one does
            found = params.get(t.storage)
            if found is not None:
                if owner is not None and found != owner:
                    return "", "none"
                owner = found
        return ("", "none") if owner is None else (owner, "parameter")


def _sources_of(inputs, running: list) -> tuple[int, ...]:
    """The host sources what a call makes comes from: its tensor arguments' when they are all on the host (none
    when one is not); a call with no tensor argument (the empty a composite allocates its result with, from self's
    options) takes those of the composite running it (`running`: the recorder's, innermost last)."""
    if not inputs:
        return running[-1] if running else ()
    for t in inputs:
        if not t.host:
            return ()
    return _host_roots(inputs)


def _host_roots(inputs) -> tuple[int, ...]:
    """The host sources of a call whose tensor arguments are all on the host (its results come from them)."""
    if len(inputs) == 1:
        return inputs[0].host_from
    return tuple(sorted({r for t in inputs for r in t.host_from}))


def _device_query(func, args, kwargs):
    """prim::device of a fake tensor, answered as FakeTensorMode's handler would (saves a dispatch)."""
    x = args[0] if len(args) == 1 else None
    if isinstance(x, FakeTensor):
        return torch.device("meta") if x.fake_mode.in_kernel_invocation else x.fake_device
    return func(*args, **kwargs)


def _drop_values(spec: dict, plan) -> None:
    """Forget the values argspec read from the arguments the call overwrites without reading (plans.py): they
    are whatever memory the tensor was given, different run to run."""
    if not (plan.overwritten_at or plan.overwritten_named):
        return
    for i in plan.overwritten_at:
        if i < len(spec["args"]) and isinstance(spec["args"][i], dict):
            spec["args"][i].pop("v", None)
    for name in plan.overwritten_named:
        if isinstance(spec["kwargs"].get(name), dict):
            spec["kwargs"][name].pop("v", None)
