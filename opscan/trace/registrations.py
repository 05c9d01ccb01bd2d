"""Trace stage: what the dispatcher holds for the custom ops a step calls — which dispatch keys have kernels,
and whether the target registered them itself (from Python: `torch.library`) or a compiled extension did.

A custom op that the target defines with `torch.library` (a `Library(...).impl(..., "CPU")`, a
`custom_op(..., device_types="cpu")`) is in this process exactly as it will be on the Mac: the same Python
code registers the same kernels there. Its registrations answer the MPS question (predict/rules.py
`target-registration-*`): an MPS kernel, a composite kernel (runs its body's ops on MPS), or neither (the
boxed fallback takes it). An op of a compiled third-party extension (torchvision's, a wheel's `.so`) is not:
its Linux build does not tell what its macOS build registers, so it gets no Registration here and stays
with the knowledge base's tables.

Read from `torch._C._dispatch_has_kernel_for_dispatch_key` (which keys have a kernel) and
`torch._C._dispatch_dump` (the file each kernel was registered at): every backend kernel registered at a
Python file (or `<stdin>`-like source) is the target's own; any at a C++/CUDA source, or with none, is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from opscan.opkey import OpKey

DISPATCH_KEYS = ("MPS", "CPU", "CUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional", "Meta")
BACKENDS = frozenset(DISPATCH_KEYS) - {"Meta"}  # the kernels that run an op on a device (Meta only computes shapes)
COMPOSITE = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
BUILT_IN = frozenset({"aten", "prims", "c10d", "_c10d_functional", "_c10d_functional_autograd", "quantized",
                      "_quantized", "profiler", "_test", "rngprims", "higher_order", "torchvision"})
_LINE = re.compile(r"^(\w+)(?:\[alias\])?: registered at (.+?):\d+ :: ", re.MULTILINE)


@dataclass(frozen=True)
class Registration:
    """A custom op registered from Python in this process: its dispatch keys with a kernel (of DISPATCH_KEYS), and the
    file and line of its first backend kernel."""

    kernels: tuple[str, ...]
    at: str

    @property
    def mps(self) -> bool:
        return "MPS" in self.kernels

    @property
    def composite(self) -> str | None:
        return next((k for k in COMPOSITE if k in self.kernels), None)


def registrations(ops) -> tuple[tuple[OpKey, Registration], ...]:
    """(op, Registration) for each distinct op of `ops` that the target registered itself from Python."""
    found = {}
    for op in ops:
        if op.namespace not in BUILT_IN and op not in found:  # (aten's, most calls: no OpKey hash)
            found[op] = registration_of(op)
    return tuple((op, reg) for op, reg in found.items() if reg is not None)


def registration_of(op: OpKey) -> Registration | None:
    """The op's Registration, or None: not a custom op, not known to the dispatcher, or not all from Python."""
    import torch

    name = op.op if op.overload == "default" else f"{op.op}.{op.overload}"
    try:
        kernels = tuple(k for k in DISPATCH_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(name, k))
        dump = torch._C._dispatch_dump(name)
    except (RuntimeError, AttributeError, TypeError):  # not registered, or a torch without these helpers
        return None
    sources = [(key, where) for key, where in _LINE.findall(dump) if key in BACKENDS]
    if not kernels or not sources or not all(_from_python(where) for _, where in sources):
        return None
    return Registration(kernels, sources[0][1])


def _from_python(where: str) -> bool:
    return where.endswith(".py") or where.startswith("<")
