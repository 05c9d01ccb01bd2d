"""Memory stage (runs inside the trace): when each storage of the step is allocated and freed.

`StorageTracker` is a TorchDispatchMode, entered below opscan's recorder, that sees every dispatched
call. A storage is allocated when it first appears (as a call's result, or as an argument no call
made: a constant), and freed when its weakref callback fires: the storage object itself is gone, not
merely its last use, so what Python keeps alive (saved tensors, retained graphs, a list of losses)
stays counted, as PyTorch's own `torch.distributed._tools.mem_tracker.MemTracker` does it. That
tracker works on CPU and under FakeTensorMode too; opscan keeps its own because it needs the order
of the events (per phase and call, and the steady state of later steps), not running totals, and it
must not fail on a step that calls the model twice (MemTracker raises for a second root forward).

Roles: parameters and buffers, and the inputs, are registered before the step; the tensors in
`p.grad` when an optimizer steps (or at the end) are gradients; the tensors in `optimizer.state` after
it stepped are optimizer state. Everything else is an activation or a temporary, by the phase of the
call that made it (estimate.py). Works on real, fake and meta tensors and on any device.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Callable, Iterable

import torch
from torch.optim import optimizer as optim_hooks
from torch.utils._python_dispatch import TorchDispatchMode

from opscan.memory.records import Block, Timeline
from opscan.memory.short import node_mark
from opscan.opkey import OpKey
from opscan.trace.guard import call_through
from opscan.trace.tensors import tensors_in

_KEEP = ("parameters", "inputs")  # roles a later mark does not override
_OWN_READS = torch._C.DisableTorchFunction  # the optimizer hooks' reads: C getters, not calls through a torch mode


class StorageTracker(TorchDispatchMode):
    """Records the step's storages; `clock()` names the call running now (default: a dispatch counter).

    `ignore_device`: storages on that device are not counted (the recorder's meta re-runs of
    composites, in a CPU or fake trace)."""

    def __init__(self, clock: Callable[[], int] | None = None, ignore_device: str | None = "meta",
                 describe: bool = False, cache=None):
        super().__init__()
        self.cache = cache  # a trace.call_cache.CallCache serving repeated calls (the sizing runs' meta tensors)
        self.calls = 0
        self.live = 0  # bytes alive now
        self.peak = 0  # most bytes alive since the last reset_peak()
        self.describe = describe  # keep each block's op, shape and dtype (the live log names suspects)
        self.details: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._func = None
        self.clock = clock or (lambda: self.calls - 1)
        self.ignore_device = ignore_device
        self.unsized = 0
        self._blocks: list[list] = []  # [nbytes, dtype, device, clock]
        self._events: list[int] = []
        self._roles: dict[int, str] = {}
        self._current: dict[int, int] = {}  # storage address -> block index
        self._refs: dict[int, weakref.ref] = {}
        self._params: list[torch.Tensor] = []
        self._handles: list = []
        self._closed = False
        self.call_marks: list | None = None  # per call: (events before it, its autograd node): memory/short.py

    def register(self, tensors: Iterable[torch.Tensor], role: str) -> None:
        """Count tensors that exist before the step (parameters, buffers, inputs) under `role`."""
        for t in tensors:
            if role == "parameters":
                self._params.append(t)
            self.mark(t, role)

    def mark(self, t: torch.Tensor, role: str) -> None:
        """Give the block of `t`'s storage a role (gradients, optimizer_state, ...)."""
        index = self._see(t, False)
        if index is not None and self._roles.get(index) not in _KEEP:
            self._roles[index] = role

    def __enter__(self) -> StorageTracker:
        self._attach()
        return super().__enter__()

    def __exit__(self, *exc):
        self._detach()
        return super().__exit__(*exc)

    @contextlib.contextmanager
    def attached(self):
        """For a tracker driven by another dispatch mode, which hands it each call it passes on (`observe`):
        the optimizer hooks only, no dispatch mode of its own (the recorder's calls cost one mode, not two)."""
        self._attach()
        try:
            yield self
        finally:
            self._detach()

    def _attach(self) -> None:
        self._handles = [optim_hooks.register_optimizer_step_pre_hook(self._before_step),
                         optim_hooks.register_optimizer_step_post_hook(self._after_step)]

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        with _OWN_READS():
            self._mark_grads(self._params)
        self._closed = True
        self._refs.clear()  # callbacks of storages that outlive the step never fire

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.observe(func, args, kwargs or {})

    def observe(self, func, args, kwargs, ins: list | None = None):
        """Run one call, counting the storages it reads (`ins`: its tensor arguments, when known) and makes."""
        return self.run(func, args, kwargs, tensors_in(args, kwargs) if ins is None else ins, _may_resize(func))[0]

    def run(self, func, args, kwargs, ins: list, grows: bool) -> tuple[object, list]:
        """`observe` for a mode that has read the call already — its tensor arguments `ins`, whether it writes into
        one (`grows`: an out= variant or `resize_` can grow a storage) — returning the result and its tensors."""
        self.calls += 1
        self._func = func
        if self.call_marks is not None:
            self.call_marks.append((len(self._events), node_mark()))
        current = self._current
        for t in ins:
            try:
                known = t.untyped_storage()._cdata in current
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            if not known:  # (a storage already counted, read again: nothing to do)
                self._see(t, False)
        if self.cache is None:
            out = call_through(func, *args, **kwargs)
        else:
            out = self.cache.call(func, args, kwargs, lambda: call_through(func, *args, **kwargs))
        outs = tensors_in(out)
        for t in outs:
            self._see(t, grows)
        return out, outs

    def events_now(self) -> int:
        """How many events were recorded so far (the recorder marks each call with it: trace/repeat.py)."""
        return len(self._events)

    def replicate(self, assembled, event_marks: list[int], units, stack) -> None:
        """The events of a short run (trace/repeat.py) rewritten as a full run's (memory/repeat.py); raises
        trace/splice.py's Refused when they do not repeat."""
        from opscan.memory.repeat import replicate_events

        params = {q: tuple(self._current[p.untyped_storage()._cdata] for p in layer.parameters())
                  for q, layer in enumerate(stack.layers)}
        replicate_events(self, assembled, event_marks, units, params, stack.runs)

    def timeline(self, batch: int | None = None) -> Timeline:
        """The immutable record of what was seen so far."""
        blocks = tuple(Block(n, d, dev, c, self._roles.get(i, "")) for i, (n, d, dev, c) in enumerate(self._blocks))
        return Timeline(blocks=blocks, events=tuple(self._events), unsized=self.unsized, batch=batch)

    def transient(self, nbytes: int, dtype: str) -> None:
        """Count `nbytes` allocated and freed at once (work a sizing run stands in for, batch.py)."""
        index = len(self._blocks)
        self._blocks.append([nbytes, dtype, "", self.clock()])
        self._events.extend((index + 1, -(index + 1)))
        self.peak = max(self.peak, self.live + nbytes)

    def reset_peak(self) -> None:
        """Start a new peak from the bytes alive now."""
        self.peak = self.live

    def _before_step(self, optimizer, args, kwargs) -> None:
        with _OWN_READS():
            self._mark_grads(p for group in optimizer.param_groups for p in group["params"])

    def _after_step(self, optimizer, args, kwargs) -> None:
        with _OWN_READS():
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self.mark(value, "optimizer_state")

    def _mark_grads(self, params) -> None:
        for p in params:
            if isinstance(p, torch.Tensor) and p.grad is not None:
                self.mark(p.grad, "gradients")

    def _see(self, t: torch.Tensor, grows: bool) -> int | None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        key = storage._cdata
        index = self._current.get(key)
        if index is not None and not grows:
            return index
        device = t.device.type
        if device == self.ignore_device or self._closed:
            return None
        nbytes = storage.nbytes()
        if type(nbytes) is not int:
            nbytes = self._nbytes(storage)
        if index is not None:
            if nbytes <= self._blocks[index][0]:
                return index
            self._events.append(-(index + 1))  # resized: the old block goes, a bigger one comes
            self.live -= self._blocks[index][0]
            self._refs.pop(index, None)
        if self.describe:
            self.details[len(self._blocks)] = (_op_name(self._func), tuple(t.shape))
        return self._allocate(key, storage, nbytes, _dtype_name(t.dtype), device)

    def _allocate(self, key: int, storage, nbytes: int, dtype: str, device: str) -> int:
        index = len(self._blocks)
        self._blocks.append([nbytes, dtype, device, self.clock()])
        self._events.append(index + 1)
        self._current[key] = index
        self._refs[index] = weakref.ref(storage, functools.partial(self._freed, key, index))
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        return index

    def _freed(self, key: int, index: int, _ref) -> None:
        if self._closed:
            return
        self._events.append(-(index + 1))
        if self._current.get(key) == index:
            del self._current[key]
            self.live -= self._blocks[index][0]
        self._refs.pop(index, None)

    def _nbytes(self, storage) -> int:
        n = storage.nbytes()
        if type(n) is int:
            return n
        hint = n.node.maybe_as_int() if isinstance(n, torch.SymInt) else None
        if hint is None and isinstance(n, torch.SymInt) and n.node.has_hint():
            hint = n.node.hint  # a backed symbolic size (dynamic shapes): its value in this run
        if hint is None:
            self.unsized += 1
            return 0
        return int(hint)


_MUTABLE: dict[int, tuple] = {}  # id(func) -> (func, _may_resize): no OpOverload.__hash__ per call


def _may_resize(func) -> bool:
    """Ops that write into an argument (out= variants, resize_) can grow its storage."""
    found = _MUTABLE.get(id(func))
    if found is None or found[0] is not func:
        schema = getattr(func, "_schema", None)
        found = _MUTABLE[id(func)] = (func, bool(schema is not None and schema.is_mutable))
    return found[1]


@functools.lru_cache(maxsize=None)
def _op_name(func) -> str:
    """'aten::mean' (the OpKey display), '(before the step)' for registered tensors."""
    if func is None:
        return "(before the step)"
    try:
        return OpKey.of(func).display
    except Exception:  # noqa: BLE001 - a callable that is not an OpOverload
        return str(func)


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def track_step(model: torch.nn.Module, inputs, clock: Callable[[], int] | None = None,
               ignore_device: str | None = "meta", describe: bool = False, cache=None) -> StorageTracker:
    """A tracker with the model's parameters and buffers and the input tensors registered."""
    tracker = StorageTracker(clock, ignore_device, describe, cache)
    tracker.register(model.parameters(), "parameters")
    tracker.register(model.buffers(), "parameters")
    tracker.register(tensors_in(inputs), "inputs")
    return tracker
