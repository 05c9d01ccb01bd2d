"""Trace stage: the user's code that picks a device, recorded where it runs — while the target is built and while
its step is traced — as a Mac would run it.

`DeviceCalls` is one run's record: each call that asks for CUDA, pinned memory or a device query, as a `DeviceCall`
(rule, what was asked as written, the user's line as a CallSite from trace/frames.py, the phase: "build" or "step",
how many times). `DeviceCode` is the TorchFunctionMode that reads each torch call with `device_request`
(device_request.py) and runs it as the trace must (on the step's own device, pinning off); `as_mac(calls)` enters
it together with the Mac's answers to device queries (mac_answers.py). What a Mac does with each rule, per
release, is the knowledge base's (opscan/knowledge/device_code.yaml), judged by predict/device_code.py.

A target file's module-level code runs once per process (target/once.py): the calls it made at import are kept per
file (`_IMPORTED`) and counted again by a later build that reuses the module (`imported`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from opscan.trace.device_request import RULE_TENSOR, device_request, mac_result
from opscan.trace.frames import Sites
from opscan.trace.guard import call_through
from opscan.trace.records import CallSite

BUILD, STEP = "build", "step"
_IMPORTED: dict[str, dict[tuple, int]] = {}  # a module file -> the calls its module-level code made, when imported
# a tensor's .cuda() made by a torch function the user's code called: the rule of that call instead
_ENTRIES = {"torch/nn/modules/module.py:Module.cuda": ("device-cuda-module", "Module.cuda()")}


@dataclass(frozen=True)
class DeviceCall:
    """One place of the user's code that asked something of a device (see the module docstring)."""

    rule: str
    asked: str  # as written: "torch.cuda.synchronize()", ".cuda()", "device='cuda'", "pin_memory=True"
    site: CallSite | None
    phase: str  # BUILD or STEP
    calls: int = 1


class DeviceCalls:
    """The DeviceCalls of one build or one traced step. `sites`: the trace's Sites (frames.py; a fresh one for a
    build); `stand_in`: the device the step's tensors are on here, which a CUDA or MPS request is run on (None: the
    default device of the moment — meta in the meta pre-pass of a build, trace/fake.py — else cpu)."""

    def __init__(self, phase: str = BUILD, sites: Sites | None = None, stand_in: torch.device | None = None):
        self.phase = phase
        self.sites = sites if sites is not None else Sites()
        self._stand_in = stand_in
        self._seen: dict[tuple, int] = {}

    @property
    def stand_in(self) -> torch.device:
        """The device a CUDA or MPS request runs on here."""
        if self._stand_in is not None:
            return self._stand_in
        default = getattr(torch, "get_default_device", None)  # torch 2.3+
        return default() if default is not None else torch.device("cpu")

    def saw(self, rule: str, asked: str, frame) -> None:
        """Record `rule` for the call made from `frame` (or a frame of opscan or torch inside it)."""
        chain, _, site = self.sites.of(frame)
        if rule == RULE_TENSOR and chain:
            rule, asked = _ENTRIES.get(chain[-1], (rule, asked))
        key = (rule, asked, site)
        # a build runs the factory twice when the meta pre-pass sizes it (trace/fake.py): a build line counts once
        self._seen[key] = 1 if self.phase == BUILD else self._seen.get(key, 0) + 1
        if self.phase == BUILD and site is not None and site.function == "<module>" and site.file:
            _IMPORTED.setdefault(site.file, {})[key] = 1

    def calls(self) -> tuple[DeviceCall, ...]:
        """What was recorded, in the order first seen."""
        return tuple(DeviceCall(rule, asked, site, self.phase, n) for (rule, asked, site), n in self._seen.items())

    def imported(self, folder: str | None) -> None:
        """Count again the import-time calls of module files under `folder` that this build did not run anew (their
        module was reused: target/once.py)."""
        if not folder:
            return
        ran = {site.file for _, _, site in self._seen if site is not None}
        root = os.path.join(os.path.abspath(folder), "")
        for file, kept in _IMPORTED.items():
            if file not in ran and file.startswith(root):
                for key, n in kept.items():
                    self._seen[key] = self._seen.get(key, 0) + n


class DeviceCode(TorchFunctionMode):
    """Each torch call read with device_request: recorded when it has a rule, run as the trace must."""

    def __init__(self, calls: DeviceCalls):
        super().__init__()
        self.seen = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        request = device_request(func, args, kwargs)
        if request is None:
            return call_through(func, *args, **kwargs)  # the user's call: its errors are theirs
        if request.rule is not None:
            self.seen.saw(request.rule, request.asked, sys._getframe())
        return mac_result(request, self.seen.stand_in, call_through)


@contextlib.contextmanager
def as_mac(calls: DeviceCalls):
    """The user's code runs as on a Mac while entered: device queries answered as a Mac answers them, CUDA calls
    recorded in `calls` (mac_answers.py), torch calls that ask for a device read by DeviceCode."""
    from opscan.trace.mac_answers import answering

    with answering(calls), DeviceCode(calls):
        yield calls
