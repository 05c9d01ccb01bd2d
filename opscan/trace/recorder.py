"""Trace stage: the TorchDispatchMode that records every dispatched call.

One small mode with one job, in the manner of torch/utils/flop_counter.py: for every call it
stores the OpKey, the phase, the module that caused it, and the metadata of each tensor argument
and result (dtype, shape, stride, device, storage identity, bytes).
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from opscan.opkey import OpKey
from opscan.trace.attribution import GradFnMapper, ModuleTracker, PhaseTracker, backward_module
from opscan.trace.bookkeeping import is_bookkeeping
from opscan.trace.guard import call_through
from opscan.trace.records import OpCall, TensorMeta


class StorageIds:
    """Small integers for storages; a freed storage's number is never reused."""

    def __init__(self):
        self._live: dict[int, tuple[int, StorageWeakRef]] = {}
        self._next = 0

    def of(self, tensor: torch.Tensor) -> int:
        """The id of `tensor`'s storage (-1 for tensors without one)."""
        try:
            ref = StorageWeakRef(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return -1
        known = self._live.get(ref.cdata)
        if known is not None and not known[1].expired():
            return known[0]
        self._next += 1
        self._live[ref.cdata] = (self._next, ref)
        return self._next


class CallRecorder(TorchDispatchMode):
    """Records each call as an `OpCall`; `fx_node` is set from outside while an fx node runs."""

    def __init__(self, tracker: ModuleTracker, mapper: GradFnMapper, phases: PhaseTracker):
        super().__init__()
        self.tracker, self.mapper, self.phases = tracker, mapper, phases
        self.storages = StorageIds()
        self.param_storages: dict[int, str] = {}
        self.calls: list[OpCall] = []
        self.fx_node: str | None = None
        self._last_phase = ""

    def index_parameters(self, model: torch.nn.Module) -> None:
        """Remember parameter storages so optimizer calls can be attributed to their module."""
        self._params = [(p, owner) for p in model.parameters()
                        if (owner := self.tracker.param_owner.get(id(p))) is not None]
        for param, owner in self._params:
            self.param_storages.setdefault(self.storages.of(param), owner)

    def _index_gradients(self) -> None:
        for param, owner in self._params:
            if param.grad is not None:
                self.param_storages[self.storages.of(param.grad)] = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        phase = self.phases.current()
        if phase == "optimizer" and self._last_phase != "optimizer":
            self._index_gradients()
        self._last_phase = phase
        inputs = self._metas(tree_leaves((args, kwargs)))
        out = call_through(func, *args, **kwargs)
        op = OpKey.of(func)
        outputs = self._metas(tree_leaves(out))
        module, how = self._module(phase, inputs)
        if how == "parameter" and phase == "optimizer":
            for t in outputs:  # optimizer state made from a parameter belongs to its module
                self.param_storages.setdefault(t.storage, module)
        self.calls.append(
            OpCall(
                index=len(self.calls),
                op=op,
                phase=phase,
                module=module,
                inputs=inputs,
                outputs=outputs,
                bookkeeping=is_bookkeeping(op),
                fx_node=self.fx_node if phase == "forward" else None,
                module_source=how,
            )
        )
        return out

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

    def _metas(self, leaves) -> tuple[TensorMeta, ...]:
        return tuple(self._meta(t) for t in leaves if isinstance(t, torch.Tensor))

    def _meta(self, t: torch.Tensor) -> TensorMeta:
        return TensorMeta(
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(int(d) for d in t.shape),
            stride=tuple(int(s) for s in t.stride()) if t.layout == torch.strided else (),
            device=str(t.device),
            storage=self.storages.of(t),
            nbytes=int(t.numel() * t.element_size()),
        )
