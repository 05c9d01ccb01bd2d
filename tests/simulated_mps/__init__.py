"""SIMULATED MPS BACKEND — FOR TESTS ONLY. Not PyTorch's MPS; never used outside the test suite.

A test hands `double(script)` (a DeviceDouble) to opscan's Python API — ProbeOptions, RunnerOptions,
remote.run, minimize — and the real probe worker loads it from its setup message; nothing else can select it
(no environment variable, no flag), and every report measured on it says `mode: simulated` and names it as
the device. It runs ops on the CPU but behaves the way MPS does where opscan's measurement depends on it
(mps_facts.md §1):

- it reads PYTORCH_ENABLE_MPS_FALLBACK once, when it is imported (unset or "0" = off, the 2.8+ parsing):
  a runner that sets the variable after import gets the old value, as with real torch;
- its fallback warning is warn-once per process (TORCH_WARN_ONCE), unless torch.set_warn_always(True);
- it raises PyTorch's exact texts, both generations (§1.4), and MPS's float64 text (§4.2);
- an asynchronous error surfaces only at the next synchronize;
- a scripted op can segfault, abort, hang, or return a wrong result.

What each op does comes from a script, the double's options (plain JSON data):
`{"generation": "2.6+" | "2.0-2.5", "default": KIND, "ops": {"aten::relu": KIND | {"kind": KIND, ...}}}`
with KIND one of native, always_cpu, always_cpu_wrong, unsupported, unsupported_error,
unsupported_abort, dtype, error, async_error, segfault, abort, hang, wrong, adaptive_divisible (the
adaptive-pool shape limit: KERNEL_ERROR_TEXT only when an input spatial size and the output size do not
divide one another, as MPS's adaptive pools check; used by the repro minimisation tests); any kind may add
`"delay": seconds`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
import warnings

import torch

from opscan.opkey import OpKey
from opscan.probe.backends import environment_record

COMMIT = "5c4886908584029761b579af026dcfb627c84070"  # torch 2.14.1 (mps_facts §0)
_RAW = os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK")  # read once, at import, like MPSFallback.mm's static
FALLBACK_ON = _RAW is not None and _RAW != "0"

FLOAT64_TEXT = ("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
                "Please use float32 instead.")
ASYNC_TEXT = "Command buffer execution failed (simulated asynchronous MPS error)"
KERNEL_ERROR_TEXT = ("Adaptive pool MPS: input sizes must be divisible by output sizes. Non-divisible input sizes "
                     "are not implemented on MPS device yet. For now, you can manually transfer tensor to cpu in "
                     "this case. Please refer to [this issue](https://github.com/pytorch/pytorch/issues/96056)")


def not_implemented_text(op: str, generation: str = "2.6+") -> str:
    """MPSFallback.mm's NotImplementedError text, 2.6-2.14.1 or 2.0-2.5 (mps_facts §1.4)."""
    if generation == "2.0-2.5":
        return (f"The operator '{op}' is not currently implemented for the MPS device. If you want this op to be "
                "added in priority during the prototype phase of this feature, please comment on "
                "https://github.com/pytorch/pytorch/issues/77764. As a temporary fix, you can set the environment "
                "variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. WARNING: this "
                "will be slower than running natively on MPS.")
    return (f"The operator '{op}' is not currently implemented for the MPS device. If you want this op to be "
            "considered for addition please comment on https://github.com/pytorch/pytorch/issues/141287 and "
            f"mention use-case, that resulted in missing op as well as commit hash {COMMIT}. As a temporary fix, "
            "you can set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback "
            "for this op. WARNING: this will be slower than running natively on MPS.")


def fallback_warning_text(op: str) -> str:
    """mps_fallback's UserWarning (all releases)."""
    return (f"The operator '{op}' is not currently supported on the MPS backend and will fall back to run on the "
            "CPU. This may have performance implications. (Triggered internally at "
            "/Users/runner/work/pytorch/pytorch/pytorch/aten/src/ATen/mps/MPSFallback.mm:16.)")


def double(script: dict | None = None):
    """The DeviceDouble that makes the probe workers load this simulator with `script` (empty: all native)."""
    from opscan.probe.backends import DeviceDouble

    return DeviceDouble("simulated_mps", "SimulatedMps", (TESTS,), script or {})


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: where the worker imports this from


class SimulatedMps:
    """The probe-backend interface (opscan/probe/backends.py), simulated on the CPU."""

    name = "simulated-mps (tests only)"
    device = "cpu"
    forkable = True

    def __init__(self, script: dict, fallback_on: bool = FALLBACK_ON):
        self.script, self.fallback_on = script, fallback_on
        self.warned = False  # TORCH_WARN_ONCE state of this process
        self.pending: Exception | None = None

    def prepare(self) -> None:
        """Nothing to initialise."""

    def describe(self) -> dict:
        """The environment record, marked as simulated."""
        record = environment_record(self.name, "mps")
        record["simulated"] = True
        if "virtual_machine" in self.script:  # a virtual Mac's record (backends.virtual_machine), scripted
            record["virtual_machine"] = self.script["virtual_machine"]
        return record

    def sync(self) -> None:
        """Raise the error an earlier op left pending (asynchronous errors surface here only)."""
        error, self.pending = self.pending, None
        if error is not None:
            raise error

    def behaviour(self, op: str) -> dict:
        """The scripted behaviour of one op."""
        found = self.script.get("ops", {}).get(op, self.script.get("default", "native"))
        return {"kind": found} if isinstance(found, str) else dict(found)

    def call(self, func, args, kwargs):
        """Run one op the way the script says MPS does."""
        op = OpKey.of(func).display
        how = self.behaviour(op)
        time.sleep(how.get("delay", 0))
        if any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in _leaves(args, kwargs)):
            raise TypeError(FLOAT64_TEXT)
        return _KINDS[how["kind"]](self, op, how, func, args, kwargs)

    def warn(self, op: str) -> None:
        """TORCH_WARN_ONCE: once per process unless warn-always is on."""
        if self.warned and not torch.is_warn_always_enabled():
            return
        self.warned = True
        warnings.warn(fallback_warning_text(op), UserWarning, stacklevel=2)

    def not_implemented(self, op: str, how: dict) -> NotImplementedError:
        """The error of the boxed fallback with the variable off (the op's or the script's generation)."""
        return NotImplementedError(not_implemented_text(op, how.get("generation", self.script.get("generation",
                                                                                                   "2.6+"))))


def _leaves(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from _leaves(value, {})
        else:
            yield value


def _run(sim, op, how, func, args, kwargs):
    return func(*args, **kwargs)


def _wrong(out):
    first = out[0] if isinstance(out, (tuple, list)) else out
    if isinstance(first, torch.Tensor) and first.is_floating_point():
        first.add_(1.0)
    return out


def _unsupported(sim, op, how, func, args, kwargs, then=_run):
    if not sim.fallback_on:
        raise sim.not_implemented(op, how)
    sim.warn(op)
    return then(sim, op, how, func, args, kwargs)


def _fallback_fails(sim, op, how, func, args, kwargs):
    raise TypeError("Trying to convert ComplexFloat to the MPS backend but it does not have support for that dtype.")


def _dtype(sim, op, how, func, args, kwargs):
    for leaf in _leaves(args, kwargs):
        if isinstance(leaf, torch.Tensor) and str(leaf.dtype).removeprefix("torch.") in how.get("dtypes", []):
            name = {"float16": "Half", "bfloat16": "BFloat16"}.get(str(leaf.dtype)[6:], str(leaf.dtype))
            raise TypeError(f"Trying to convert {name} to the MPS backend but it does not have support for that dtype.")
    return func(*args, **kwargs)


def _async_error(sim, op, how, func, args, kwargs):
    out = func(*args, **kwargs)
    sim.pending = RuntimeError(ASYNC_TEXT)
    return out


def _hang(sim, op, how, func, args, kwargs):
    if how.get("child_pid_file"):  # a grandchild in the worker's process group, to show the group is killed
        child = subprocess.Popen(["sleep", "3600"])
        with open(how["child_pid_file"], "w", encoding="utf-8") as f:
            f.write(str(child.pid))
    time.sleep(3600)


def _kernel_error(*_):
    raise RuntimeError(KERNEL_ERROR_TEXT)


def _adaptive_divisible(sim, op, how, func, args, kwargs):
    """Adaptive pooling forward (self, output_size) or backward (grad_output, self): the larger of each
    input/output spatial pair must be a multiple of the smaller, else MPS's kernel error."""
    if isinstance(args[1], torch.Tensor):  # backward: the output size is grad_output's
        inputs, outputs = args[1].shape[-2:], args[0].shape[-2:]
    else:
        outputs = list(args[1])
        inputs = args[0].shape[-len(outputs):]
    if any(max(i, o) % min(i, o) for i, o in zip(inputs, outputs) if min(i, o) > 0):
        _kernel_error()
    return func(*args, **kwargs)


_KINDS = {
    "native": _run,
    "always_cpu": lambda sim, op, how, f, a, k: (sim.warn(op), f(*a, **k))[1],
    "always_cpu_wrong": lambda sim, op, how, f, a, k: (sim.warn(op), _wrong(f(*a, **k)))[1],
    "unsupported": _unsupported,
    "unsupported_error": lambda *x: _unsupported(*x, then=_fallback_fails),
    "unsupported_abort": lambda *x: _unsupported(*x, then=lambda *_: os.abort()),
    "unsupported_wrong": lambda *x: _unsupported(*x, then=lambda s, o, h, f, a, k: _wrong(f(*a, **k))),
    "dtype": _dtype,
    "error": _kernel_error,
    "async_error": _async_error,
    "segfault": lambda *_: ctypes.string_at(0),
    "abort": lambda *_: os.abort(),
    "hang": _hang,
    "wrong": lambda sim, op, how, f, a, k: _wrong(f(*a, **k)),
    "adaptive_divisible": _adaptive_divisible,
}

