"""Trace stage: what one torch call asks of a device, read as a Mac reads it — a pure function of the call.

`device_request(func, args, kwargs)` returns a `DeviceRequest` for the calls whose meaning depends on the machine:
- `x.cuda()` (a tensor's, and so each parameter's under `Module.cuda()`), `x.to("cuda")`, a factory's
  `device="cuda"` (a string, a `torch.device` or an index): rule `device-cuda-tensor` / `device-cuda-arg`;
  on a Mac each raises (docs/trace.md, opscan/knowledge/device_code.yaml);
- `pin_memory=True` to a factory, `x.pin_memory()`: rule `device-pin-memory`;
- `device="mps"` / `x.to("mps")`: no rule — it is what the user should write — but the tracing host has no MPS.

Every request carries the call as the trace runs it instead (`mac_call(stand_in)`): the device the step stands on
(cpu, or meta in a sizing run) where CUDA or MPS was asked for, given as a `torch.device` object (a literal "cpu"
string is read as a host move by trace/moves.py), `pin_memory` off, `pin_memory()` the tensor itself. So a host
with CUDA and one without run the same step, and a step written for a Mac runs at all. None for every other call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RULE_TENSOR = "device-cuda-tensor"  # x.cuda(); Module.cuda() calls it on every parameter and buffer
RULE_ARG = "device-cuda-arg"  # device="cuda", x.to("cuda"), torch.device("cuda") handed to a call
RULE_PIN = "device-pin-memory"  # pin_memory=True, x.pin_memory()

_PINNED = frozenset({torch.Tensor.pin_memory})
_TO = frozenset({torch.Tensor.to})
_CUDA = frozenset({torch.Tensor.cuda})
ASKING = _CUDA | _PINNED | _TO  # the functions that can ask for a device without a keyword argument


@dataclass(frozen=True)
class DeviceRequest:
    """A call that asks for a device (or pinned memory): its rule (None: the MPS spelling, nothing to report), what
    it asked as written ("x.cuda()", "device='cuda'"), and the call's arguments."""

    rule: str | None
    asked: str
    func: object
    args: tuple
    kwargs: dict

    def mac_call(self, stand_in: torch.device) -> tuple[tuple, dict]:
        """(args, kwargs) as the trace runs the call: on `stand_in` where a device was named, pinning off."""
        args, kwargs = self.args, dict(self.kwargs)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if _names_device(kwargs.get("device")):
            kwargs["device"] = stand_in
        if self.func in _TO and len(args) > 1 and _names_device(args[1]):
            args = (args[0], stand_in, *args[2:])
        return args, kwargs


def device_request(func, args: tuple, kwargs: dict) -> DeviceRequest | None:
    """The DeviceRequest of a torch call (see the module docstring), or None (always for a call without keyword
    arguments of a function not in `ASKING`)."""
    if func in _CUDA:
        return DeviceRequest(RULE_TENSOR, ".cuda()", func, args, kwargs)
    if func in _PINNED:
        return DeviceRequest(RULE_PIN, ".pin_memory()", func, args, kwargs)
    asked = kwargs.get("device")
    if func in _TO and asked is None and len(args) > 1 and not isinstance(args[1], (torch.Tensor, torch.dtype)):
        asked = args[1]
    kind = _kind(asked)
    if kind == "cuda":
        return DeviceRequest(RULE_ARG, f"device={_spelled(asked)}", func, args, kwargs)
    if kwargs.get("pin_memory") is True:
        return DeviceRequest(RULE_PIN, "pin_memory=True", func, args, kwargs)
    if kind == "mps":
        return DeviceRequest(None, f"device={_spelled(asked)}", func, args, kwargs)
    return None


def _kind(device) -> str | None:
    """"cuda" or "mps" when `device` names one (a string, a torch.device; a bare int is a CUDA index), else None."""
    if isinstance(device, torch.device):
        return device.type if device.type in ("cuda", "mps") else None
    if isinstance(device, str):
        kind = device.split(":", 1)[0].strip()
        return kind if kind in ("cuda", "mps") else None
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"  # torch.zeros(2, device=0): device index 0 of the default (CUDA) device type
    return None


def _names_device(device) -> bool:
    return _kind(device) is not None


def _spelled(device) -> str:
    return repr(str(device)) if isinstance(device, torch.device) else repr(device)


def mac_result(request: DeviceRequest, stand_in: torch.device, run):
    """The call as the trace runs it: `run(func, *args, **kwargs)` of the Mac call; `x.pin_memory()` is `x`, and
    `x.cuda(...)` is `x.to(stand_in)` (the move the user meant, to the device the step stands on)."""
    if request.func in _PINNED:
        return request.args[0]
    if request.func in _CUDA:
        return run(torch.Tensor.to, request.args[0], stand_in)
    args, kwargs = request.mac_call(stand_in)
    return run(request.func, *args, **kwargs)
