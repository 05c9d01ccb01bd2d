"""Accept stage (placement modes): the dispatch and function modes the placement recorder enters.

`Copies` (a TorchDispatchMode) sees every aten call: the copies that cross devices (`aten::_to_copy`,
`copy_`, `_local_scalar_dense`) and the warnings each call raised (PyTorch's MPS fallback warning among
them). `Requests` (a TorchFunctionMode) names the request behind a copy (`cpu()`, `to('cpu')`, `tolist()`,
`print`, `numpy()`, `item()`, `bool()`, `float()`, `int()`, `to()`, `cuda()`, `copy_()`) and who made it:
the model's code, torch itself, or opscan. Both report to the recorder (placement.PlacementRecorder), which
keeps the record; this module keeps none.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from opscan.trace.guard import call_through
from opscan.trace.moves import _label as host_move_label

_READS = {torch.Tensor.item: "item()", torch.Tensor.__bool__: "bool()", torch.Tensor.__float__: "float()",
          torch.Tensor.__int__: "int()", torch.Tensor.numpy: "numpy()"}
_MOVES = {torch.Tensor.to: "to()", torch.Tensor.cuda: "cuda()", torch.Tensor.copy_: "copy_()"}
HOST_LABELS = frozenset({"cpu()", "to('cpu')", "tolist()", "print", *_READS.values()})
_aten = torch.ops.aten
_HOST = torch.device("cpu")
_COPY_OPS = (_aten._to_copy, _aten.copy_, _aten._local_scalar_dense)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PASS_THROUGH = frozenset({"__torch_function__", "call_through"})
_MACHINERY = (os.path.join(_TORCH_DIR, "overrides.py"), os.path.join(_TORCH_DIR, "_tensor.py"))


class Copies(TorchDispatchMode):
    """Sees every aten call: copies across devices, and the warnings each call raised."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = call_through(func, *args, **(kwargs or {}))
        if func.overloadpacket in _COPY_OPS:
            self.recorder._copied(func, args, out)
        if self.recorder._seen < len(self.recorder._caught):
            self.recorder._drain(func, args, out)
        return out


class Requests(TorchFunctionMode):
    """Names the user-level request behind a copy, and records host requests that copy nothing here."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        label = _request_label(func, args, kwargs) if isinstance(x, torch.Tensor) else None
        if label is None:
            return call_through(func, *args, **kwargs)
        rec, origin = self.recorder, _origin()
        rec._labels.append((label, origin))
        try:
            out = call_through(func, *args, **kwargs)
        finally:
            rec._labels.pop()
        if origin == "model" and label in HOST_LABELS:
            rec._requested(label, x)
        return out


def _request_label(func, args, kwargs) -> str | None:
    return host_move_label(func, args, kwargs) or _READS.get(func) or _MOVES.get(func)


def _origin() -> str:
    """Who made the request: "model" (its code, Hugging Face's included), "torch" or "opscan"."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_name in _PASS_THROUGH or frame.f_code.co_filename in _MACHINERY):
        frame = frame.f_back  # other modes' __torch_function__, call_through, torch's own dispatch helpers
    path = frame.f_code.co_filename if frame is not None else ""
    return "opscan" if path.startswith(_OPSCAN_DIR) else "torch" if path.startswith(_TORCH_DIR) else "model"


def copy_ends(func, args, out) -> tuple[torch.Tensor, torch.device]:
    """(what was read, the device it went to) of a copy op; a Python scalar goes to the host."""
    packet = func.overloadpacket
    if packet is _aten._local_scalar_dense:
        return args[0], _HOST
    if packet is _aten.copy_:
        return args[1], args[0].device
    return args[0], out.device
