"""Trace stage: make the explicit host moves of user code visible to the recorder.

On the CPU, `.cpu()`, `.to("cpu")`, `.tolist()` and printing a tensor dispatch nothing (the tensor is
already there), so a CPU trace cannot see them; on MPS each is a device-to-host copy that waits for the
device. `ExplicitMoves` (a job of the trace's one TorchFunctionMode, trace/functions.py) wraps each of them in a
profiler range labelled `opscan.move:<what>` — recorded as a bookkeeping call, like Optimizer.step's
ranges — and, where the call itself would dispatch nothing, dispatches the `aten::_to_copy(device=cpu)`
that MPS runs, so the recorder records the copy with its phase and module. `.cpu()` and `.to("cpu")` then
return that copy (same values, same autograd), so what is read from it afterwards is the host copy.

Not wrapped: `.item()` and `bool(t)` (they dispatch `aten::_local_scalar_dense` on every device),
`.numpy()` (on MPS it needs a `.cpu()` first, which is what moves), and `.to(some_device_object)`: in a
CPU trace `x.to(y.device)` and `x.to(torch.device("cpu"))` look alike, so only a literal `"cpu"` counts.
`opscan.markers.move_labels(calls)` reads the ranges back from a trace.
"""

from __future__ import annotations

import contextlib

import torch

from opscan.markers import MOVE_PREFIX
from opscan.trace.guard import call_through

_CPU = torch.device("cpu")
_READS = (torch.Tensor.tolist, torch.Tensor.__repr__, torch.Tensor.__format__)
_LABELLED = frozenset({torch.Tensor.cpu, torch.Tensor.to, *_READS})  # the functions _label can name


class ExplicitMoves:
    """Labels `.cpu()`, `.to("cpu")`, `.tolist()` and printing; dispatches the copy MPS would run. What `.cpu()`
    and `.to("cpu")` return stays on the host (a "to-host" source of the placement model, trace/tensors.py):
    on a Mac, what is computed from it alone runs on the CPU (`probs.cpu().double()`), and it meets an MPS
    kernel only if the step hands it back without a move."""

    funcs = _LABELLED

    def __init__(self, storages=None):
        self.storages = storages  # the recorder's StorageIds (its StoragePlaces); None: labels only

    def wrap(self, inner):
        """The chain link for the labelled functions (trace/functions.py)."""
        def run(func, args, kwargs):
            x = args[0] if args else None
            label = _label(func, args, kwargs) if isinstance(x, torch.Tensor) else None
            if label is None or x.device.type == "meta":
                return inner(func, args, kwargs)
            with torch.autograd.profiler.record_function(MOVE_PREFIX + label):
                if func in _READS:
                    call_through(_copy_to_host, x)
                    return inner(func, args, kwargs)
                with self._to_host(label):
                    if _noop_to(func, x, args, kwargs):
                        return call_through(_copy_to_host, x)  # what MPS dispatches; the caller gets the host copy
                    return inner(func, args, kwargs)
        return run

    @contextlib.contextmanager
    def _to_host(self, label: str):
        """While a move to the host runs, what it makes is a host source named by the move."""
        placement = self.storages.placement if self.storages is not None else None
        if placement is None or not placement.tracking or placement.factory is not None:
            yield
            return
        placement.factory, placement.factory_kind = f".{label}", "to-host"
        try:
            yield
        finally:
            placement.end_factory()


def _copy_to_host(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._to_copy.default(x, device=_CPU)


def _label(func, args, kwargs) -> str | None:
    if func is torch.Tensor.cpu:
        return "cpu()"
    if func is torch.Tensor.to and _literal_cpu(args[1:], kwargs):
        return "to('cpu')"
    if func is torch.Tensor.tolist:
        return "tolist()"
    if func is torch.Tensor.__repr__ or (func is torch.Tensor.__format__ and args[0].dim() > 0):
        return "print"
    return None


def _noop_to(func, x: torch.Tensor, args, kwargs) -> bool:
    """True when the call would dispatch nothing here (the tensor already is a CPU tensor of that dtype)."""
    if x.device.type != "cpu" or kwargs.get("copy"):
        return False
    if func is torch.Tensor.cpu:
        return True
    _, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    return (dtype is None or dtype == x.dtype) and memory_format in (None, torch.preserve_format)


def _literal_cpu(args, kwargs) -> bool:
    device = kwargs.get("device", args[0] if args else None)
    return isinstance(device, str) and device.split(":")[0] == "cpu"
