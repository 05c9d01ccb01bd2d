"""Trace stage: a Mac's answers to the user's device questions, while the user's code runs (`answering(calls)`).

A tracing host with CUDA must trace the same step as one without, and both must trace what a Mac runs. While
entered (the target's build and its traced step, not opscan's probes, accept or --memory runs, which use real
devices), as every macOS wheel of 2.0.0-2.14.1 answers (opscan/knowledge/device_code.yaml has the sources):
- `torch.cuda.is_available()` False, `torch.cuda.device_count()` 0, `torch.cuda.is_initialized()` False, and
  `torch.cuda._lazy_init()` raises "Torch not compiled with CUDA enabled" (a macOS wheel's torch._C has no
  `_cuda_getDeviceCount`), so torch's own CUDA paths (GradScaler, autocast, DataLoader) take their Mac branch;
- `torch.backends.mps.is_available()` / `is_built()` and `torch.mps.is_available()` True; `torch.accelerator`
  (2.6+) names mps; `torch.mps.synchronize()`, `empty_cache()` and the memory counters run as no-ops here.
The user's own calls are recorded in `calls` (device_calls.DeviceCalls) at their line, and then run as the line
would once fixed (`torch.cuda.synchronize()` does nothing; a memory counter reads 0): `torch.cuda` functions in
CUDA_CALLS, is_available and device_count called from the user's own code (read by device_picks.py), a cuDNN flag
set (`torch.backends.cudnn.benchmark = True`: the flag is set, and put back on leaving), a GradScaler made for
"cuda" and a DataLoader with `pin_memory=True`. Calls from torch itself are answered, never recorded.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import sys

import torch

from opscan.target.user_code import own_file
from opscan.trace.device_picks import PICK_CPU, PICK_MPS, pick_of

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
NOT_COMPILED = "Torch not compiled with CUDA enabled"
# torch.cuda.<name> called by the user's (or a library's) code: (rule, what the trace returns instead)
CUDA_CALLS = {
    "synchronize": ("device-cuda-synchronize", None),
    "empty_cache": ("device-cuda-empty-cache", None),
    "manual_seed": ("device-cuda-seed", None), "manual_seed_all": ("device-cuda-seed", None),
    "seed": ("device-cuda-seed", None), "seed_all": ("device-cuda-seed", None),
    "memory_allocated": ("device-cuda-memory", 0), "max_memory_allocated": ("device-cuda-memory", 0),
    "memory_reserved": ("device-cuda-memory", 0), "max_memory_reserved": ("device-cuda-memory", 0),
    "memory_stats": ("device-cuda-memory", collections.OrderedDict),
    "reset_peak_memory_stats": ("device-cuda-reset-peak", None),
    "reset_max_memory_allocated": ("device-cuda-reset-peak", None),
    "set_device": ("device-cuda-set-device", None),
    "current_device": ("device-cuda-current-device", 0),
}
QUERIES = {"is_available": False, "device_count": 0}  # recorded from the user's own code (device_picks.py)
CUDNN_FLAGS = ("benchmark", "deterministic", "enabled", "allow_tf32")
_MPS_NOOPS = ("synchronize", "empty_cache", "manual_seed", "seed", "set_per_process_memory_fraction")
_MPS_ZEROS = ("current_allocated_memory", "driver_allocated_memory", "recommended_max_memory")


@contextlib.contextmanager
def answering(calls):
    """Answer as a Mac and record the user's CUDA calls in `calls` while entered (see the module docstring)."""
    with contextlib.ExitStack() as stack:
        for owner, name, value in _patches(calls):
            if owner is not None and hasattr(owner, name):
                original = inspect.getattr_static(owner, name)
                setattr(owner, name, _like(original, value))
                stack.callback(setattr, owner, name, original)
        stack.enter_context(_cudnn_flags(calls))
        yield


def _patches(calls):
    """(owner, attribute, value) for every answer (an owner or attribute this torch lacks is skipped)."""
    cuda, mps = torch.cuda, torch.backends.mps
    yield from ((cuda, name, _cuda_call(calls, name, *entry)) for name, entry in CUDA_CALLS.items())
    yield from ((cuda, name, _query(calls, name, answer)) for name, answer in QUERIES.items())
    yield cuda, "is_initialized", lambda: False
    yield cuda, "_lazy_init", _not_compiled
    yield mps, "is_available", lambda: True
    yield mps, "is_built", lambda: True
    yield torch.mps, "is_available", lambda: True
    yield from ((torch.mps, name, _none) for name in _MPS_NOOPS)
    yield from ((torch.mps, name, _zero) for name in _MPS_ZEROS)
    accelerator = getattr(torch, "accelerator", None)  # torch 2.6+
    yield accelerator, "is_available", lambda *a, **k: True
    yield accelerator, "current_accelerator", lambda *a, **k: torch.device("mps")
    yield accelerator, "device_count", lambda: 1
    scaler = torch.amp.grad_scaler.GradScaler
    yield scaler, "__init__", _scaler_init(calls, scaler.__init__)
    loader = torch.utils.data.DataLoader
    yield loader, "__init__", _loader_init(calls, loader.__init__)


def _like(original, value):
    """`value` with the name, docstring and `__wrapped__` of the function it stands in for (torch._dynamo, imported
    lazily, reads `torch.backends.mps.is_available.__wrapped__`)."""
    if callable(original) and inspect.isfunction(value):
        functools.update_wrapper(value, original)
    return value


def _not_compiled(*args, **kwargs):
    raise AssertionError(NOT_COMPILED)


def _none(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _outside_torch(frame) -> bool:
    """Is `frame` code outside torch and opscan (the user's, or a library's)?"""
    path = os.path.abspath(frame.f_code.co_filename)
    return not path.startswith((_TORCH_DIR, _OPSCAN_DIR))


def _cuda_call(calls, name: str, rule: str, result):
    def call(*args, **kwargs):
        caller = sys._getframe(1)
        if _outside_torch(caller):
            calls.saw(rule, f"torch.cuda.{name}()", caller)
        return result() if callable(result) else result
    call.__name__ = name
    return call


def _query(calls, name: str, answer):
    def query(*args, **kwargs):
        caller = sys._getframe(1)
        if own_file(os.path.abspath(caller.f_code.co_filename)):
            pick = pick_of(caller)
            if pick != PICK_MPS:
                rule = "device-pick-cpu" if pick == PICK_CPU else "device-cuda-query"
                calls.saw(rule, f"torch.cuda.{name}()", caller)
        return answer
    query.__name__ = name
    return query


def _scaler_init(calls, original):
    signature = inspect.signature(original)

    def __init__(scaler, *args, **kwargs):
        original(scaler, *args, **kwargs)
        enabled = signature.bind(scaler, *args, **kwargs).arguments.get("enabled", True)
        if getattr(scaler, "_device", None) == "cuda" and enabled:
            calls.saw("device-gradscaler-cuda", _scaler_spelling(scaler), sys._getframe(1))
    return __init__


def _scaler_spelling(scaler) -> str:
    old = getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)
    return "torch.cuda.amp.GradScaler()" if old is not None and isinstance(scaler, old) else \
        "torch.amp.GradScaler('cuda')"


def _loader_init(calls, original):
    def __init__(loader, *args, **kwargs):
        original(loader, *args, **kwargs)
        if getattr(loader, "pin_memory", False):
            calls.saw("device-pin-memory-loader", "DataLoader(pin_memory=True)", sys._getframe(1))
    return __init__


class _Flag:
    """A cuDNN flag of torch.backends.cudnn (a ContextProp) that records being set from outside torch."""

    def __init__(self, original, name: str, calls):
        self.original, self.name, self.calls = original, name, calls

    def __get__(self, obj, owner=None):
        return self.original.__get__(obj, owner)

    def __set__(self, obj, value) -> None:
        caller = sys._getframe(1)
        if _outside_torch(caller):
            self.calls.saw("device-cudnn-flag", f"torch.backends.cudnn.{self.name} = {value!r}", caller)
        self.original.__set__(obj, value)


@contextlib.contextmanager
def _cudnn_flags(calls):
    """Record the cuDNN flags the user's code sets; put their values back on leaving."""
    module = torch.backends.cudnn
    owner = type(module)
    names = [n for n in CUDNN_FLAGS if hasattr(inspect.getattr_static(owner, n, None), "__set__")]
    saved = {n: getattr(module, n) for n in names}
    originals = {n: inspect.getattr_static(owner, n) for n in names}
    try:
        for n in names:
            setattr(owner, n, _Flag(originals[n], n, calls))
        yield
    finally:
        for n in names:
            setattr(owner, n, originals[n])
            with contextlib.suppress(RuntimeError):  # flags frozen (torch.backends.flags_frozen)
                setattr(module, n, saved[n])
