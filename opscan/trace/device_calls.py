"""Trace stage: the user's code that picks a device, recorded where it runs — while the target is built and while
its step is traced — as a Mac would run it.

`DeviceCalls` is one run's record: each call that asks for CUDA, pinned memory or a device query, as a `DeviceCall`
(rule, what was asked as written, the user's line as a CallSite from trace/frames.py, the phase: "build" or "step",
how many times). `DeviceCode` is the job of the one TorchFunctionMode (trace/functions.py) that reads each torch call
with `device_request` (device_request.py) and runs it as the trace must (on the step's own device, pinning off);
`as_mac(calls)` enters it, in a mode of its own, together with the Mac's answers to device queries (mac_answers.py);
the traced step runs it as the last job of the step's mode. What a Mac does with each rule, per
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

from opscan.trace.device_request import ASKING, RULE_TENSOR, device_request, mac_result
from opscan.trace.frames import Sites
from opscan.trace.functions import StepFunctions
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


class DeviceCode:
    """Each torch call read with device_request: recorded when it has a rule, run as the trace must (a job of
    trace/functions.py's StepFunctions, acting on every call; the innermost one: the call it runs is the Mac's)."""

    funcs = None  # every call

    def __init__(self, calls: DeviceCalls):
        self.seen = calls

    def wrap(self, inner):
        """The chain link for every call (trace/functions.py)."""
        seen = self.seen

        def again(func, *args, **kwargs):
            return inner(func, args, kwargs)  # the user's call: its errors are theirs

        def run(func, args, kwargs):
            if not kwargs and func not in ASKING:  # (most calls: no device asked for)
                return inner(func, args, kwargs)
            request = device_request(func, args, kwargs)
            if request is None:
                return inner(func, args, kwargs)
            if request.rule is not None:
                seen.saw(request.rule, request.asked, sys._getframe())
            return mac_result(request, seen.stand_in, again)
        return run


@contextlib.contextmanager
def as_mac(calls: DeviceCalls, code: DeviceCode | None = None):
    """The user's code runs as on a Mac while entered: device queries answered as a Mac answers them, CUDA calls
    recorded in `calls` (mac_answers.py), torch calls that ask for a device read by DeviceCode (`code`, else a new
    one) in a mode of its own."""
    with answering_as_mac(calls), StepFunctions((code or DeviceCode(calls),)):
        yield calls


@contextlib.contextmanager
def answering_as_mac(calls: DeviceCalls):
    """Device queries answered as a Mac answers them (mac_answers.py), without the torch-call mode: the traced step
    runs DeviceCode as a job of its own mode."""
    from opscan.trace.mac_answers import answering

    with answering(calls):
        yield calls
