"""Probe stage (worker side): the device a probe runs on — cpu, cuda or mps — behind one small interface.

A backend places tensors, runs the op, synchronizes (so an asynchronous error lands on its own
probe) and describes the process it runs in. Creating a backend touches no device: `prepare()` does,
in the child, so a launcher may fork a process that only imported torch (`forkable`).

Tests replace the device with a test double (tests/simulated_mps/): a `DeviceDouble` names an importable
object with the same interface, and reaches the worker only through the Python API (ProbeOptions,
RunnerOptions) and the worker protocol's setup message — no environment variable, no command-line flag, so a
user-facing run can never be measured on one. A double's environment record always says `simulated: true`.
"""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field

import torch

MPS_ENV_PREFIXES = ("PYTORCH_MPS_", "PYTORCH_ENABLE_MPS_FALLBACK", "PYTORCH_DEBUG_MPS_", "MTL_")


class Backend:
    """A real device: `device` is the torch device string the probe's tensors go to."""

    name = "cpu"
    device = "cpu"
    forkable = True  # may run in a child forked from a process that imported torch but touched no device

    def prepare(self) -> None:
        """Per-process setup, in the child (device initialisation happens here or later)."""

    def call(self, func, args, kwargs):
        """Run the op."""
        return func(*args, **kwargs)

    def sync(self) -> None:
        """Wait for the device to finish (errors of asynchronous work surface here)."""

    def describe(self) -> dict:
        """The environment record of this process (no pids or times: reports must compare equal)."""
        return environment_record(self.name, self.device)


class CudaBackend(Backend):
    """CUDA with TF32 off, so float32 matmuls and convolutions are float32."""

    name = device = "cuda"

    def prepare(self) -> None:
        """Turn TF32 off (declared in the report)."""
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def sync(self) -> None:
        """torch.cuda.synchronize()."""
        torch.cuda.synchronize()

    def describe(self) -> dict:
        """Adds the GPU, CUDA version and TF32 setting."""
        record = super().describe()
        record.update(cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0), tf32=False)
        return record


class MpsBackend(Backend):
    """Apple's MPS. Never forked: the Objective-C runtime and Metal are not fork-safe."""

    name = device = "mps"
    forkable = False

    def sync(self) -> None:
        """torch.mps.synchronize()."""
        torch.mps.synchronize()


REAL = {"cpu": Backend, "cuda": CudaBackend, "mps": MpsBackend}


@dataclass(frozen=True)
class DeviceDouble:
    """A test double of a device: `module.attr` (importable once `path` is on sys.path) is a backend, or, with
    `options`, a factory called with them. Tests only; crosses to the worker in its setup message."""

    module: str
    attr: str = "BACKEND"
    path: tuple[str, ...] = ()
    options: dict | None = field(default=None, hash=False)

    def to_dict(self) -> dict:
        """JSON form (the setup message)."""
        return {"module": self.module, "attr": self.attr, "path": list(self.path), "options": self.options}

    @classmethod
    def from_dict(cls, d: dict | None) -> "DeviceDouble | None":
        """Inverse of to_dict (None stays None)."""
        return None if d is None else cls(d["module"], d["attr"], tuple(d["path"]), d.get("options"))


def load_backend(device: str, double: DeviceDouble | None = None):
    """The backend for `device`, or the test double the parent named in the setup message."""
    if double is None:
        return REAL[device]()
    sys.path[:0] = [p for p in double.path if p not in sys.path]
    made = getattr(importlib.import_module(double.module), double.attr)
    return Simulated(made(double.options) if double.options is not None else made)


class Simulated:
    """A test double as the worker holds it: its own behaviour, but an environment record that always says
    `simulated: true` and names the double, whatever the double itself reports."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.device, self.forkable = inner.name, inner.device, getattr(inner, "forkable", False)

    def prepare(self) -> None:
        """The double's own setup."""
        self.inner.prepare()

    def call(self, func, args, kwargs):
        """The double runs the op."""
        return self.inner.call(func, args, kwargs)

    def sync(self) -> None:
        """The double's synchronize."""
        self.inner.sync()

    def describe(self) -> dict:
        """The double's record, marked simulated."""
        return {**self.inner.describe(), "backend": self.inner.name, "simulated": True}


def environment_record(backend: str, device: str) -> dict:
    """torch and its git hash, Python, platform, macOS and chip on a Mac, MPS built/available, the
    fallback variable as this process saw it at start, and every MPS variable in force."""
    mac = platform.mac_ver()[0] or None
    return {
        "backend": backend,
        "device": device,
        "torch": str(torch.__version__),
        "torch_git": getattr(torch.version, "git_version", None),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "macos": mac,
        "chip": _chip() if mac else None,
        "virtual_machine": virtual_machine(_sysctl) if mac else None,
        "mps_built": bool(torch.backends.mps.is_built()),
        "mps_available": bool(torch.backends.mps.is_available()),
        "fallback_env": os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK", "unset"),
        "mps_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(MPS_ENV_PREFIXES)},
    }


def _chip() -> str | None:
    return _sysctl("machdep.cpu.brand_string")


def _sysctl(name: str) -> str | None:
    """`sysctl -n NAME`, or None when it cannot be read."""
    try:
        # macOS's sysctl found on PATH; argv is fixed but for `name`, one of this module's own constant keys
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)  # noqa: S603, S607
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def virtual_machine(sysctl) -> dict | None:
    """Whether this Mac is a virtual machine (GitHub's hosted macOS runners, UTM, Parallels, Tart, Anka ...),
    from what macOS itself says (`sysctl(name)` reads one value): `kern.hv_vmm_present` is 1 in a guest of
    Apple's Hypervisor framework, `hw.model` is "VirtualMac…" under Virtualization.framework, and the CPU brand
    string of a guest may say "Virtual". None when no signal says so; else {"detected": True, "signals": [...]}.
    MPS in such a guest is a paravirtualised GPU: it reports MPS available, then fails or differs from Apple
    Silicon, so its measurements never stand for MPS (probe/stage.py measured_on)."""
    signals = []
    if (sysctl("kern.hv_vmm_present") or "").strip() == "1":
        signals.append("kern.hv_vmm_present=1")
    model = sysctl("hw.model") or ""
    if "virtual" in model.lower():
        signals.append(f"hw.model={model}")
    brand = sysctl("machdep.cpu.brand_string") or ""
    if "virtual" in brand.lower():
        signals.append(f"machdep.cpu.brand_string={brand}")
    return {"detected": True, "signals": signals} if signals else None
