"""Trace stage: fake tensors, for steps whose model would not fit in RAM (`--fake`, or chosen by itself).

A real module can't be moved into FakeTensorMode after it is built, so the factory call itself (and
the construction of its inputs) runs inside the mode; the step is then traced inside the same mode,
with the same lens, MPS view and verdicts as a real run. Nothing is allocated: every tensor is a
FakeTensor over meta storage that knows its dtype, shape, stride, device and storage identity.

Whether to switch by itself: a meta-device pre-pass builds the model under `torch.device("meta")`
and sums its parameter bytes. A training step keeps about STATE_COPIES = 4 copies of them (weights,
gradients, AdamW's two moments; activations come on top); when that exceeds RAM_FRACTION = 0.5 of
the available RAM (MemAvailable), the scan builds and traces with fake tensors and says so.

Values fake tensors don't have: constants (AdamW's step counters, made by `torch.tensor`) keep
theirs, so `.item()` on them works; other `.item()` calls, `nonzero`, masks and `unique` get
unbacked symbolic sizes from a ShapeEnv (recorded as -1). Python code that branches on such a value
stops the step: the calls before it are reported and a note says where and why.

Speed: the mode is a FastFakeMode (fast_fake.py), which serves the calls every layer repeats from a
small cache in front of FakeTensorMode's own; torch's foreach paths (clip_grad_norm_) are opened to
fake tensors while tracing, so they take the path a real CPU tensor takes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensor, FakeTensorMode,
    UnsupportedOperatorException,
)

from opscan.units import human_bytes

log = logging.getLogger("opscan")

STATE_COPIES = 4  # weights + gradients + AdamW exp_avg + exp_avg_sq
RAM_FRACTION = 0.5  # switch to fake tensors when STATE_COPIES x parameter bytes exceed this much of RAM


@dataclass(frozen=True)
class FakeBuild:
    """The mode a target was built (and will be traced) in, and why fake tensors were used."""

    mode: Any  # FakeTensorMode
    reason: str


@dataclass(frozen=True)
class Footprint:
    """The meta pre-pass: parameter bytes, the step's estimate, and the RAM it is compared with."""

    param_bytes: int
    copies: int
    available: int
    input_bytes: int = 0  # the --input tensors, which are built before the step too

    @property
    def estimate(self) -> int:
        """Bytes the step's weights, gradients, optimizer state and --input tensors take (activations not
        counted)."""
        return self.param_bytes * self.copies + self.input_bytes

    def too_big(self) -> bool:
        """True when the estimate exceeds RAM_FRACTION of the available RAM."""
        return self.estimate > RAM_FRACTION * self.available

    def describe(self) -> str:
        """One sentence for stderr and the report's notes."""
        inputs = f" + {human_bytes(self.input_bytes)} of --input tensors" if self.input_bytes else ""
        return (f"parameters take {human_bytes(self.param_bytes)}; x{self.copies} for "
                f"{'weights, gradients and AdamW state' if self.copies > 1 else 'weights'}{inputs} = "
                f"{human_bytes(self.estimate)}, more than {RAM_FRACTION:.0%} of the "
                f"{human_bytes(self.available)} of RAM available")


@dataclass(frozen=True)
class FakeChoice:
    """How the target is built: `force` (--fake), `auto` (switch when it would not fit), dtype, inference."""

    force: bool = False
    auto: bool = True
    dtype: str | None = None
    inference: bool = False

    def __call__(self, factory: Callable, args: dict[str, Any], input_bytes: int = 0) -> FakeBuild | None:
        """A FakeBuild to build the target in, or None for real tensors (input_bytes: what --input makes)."""
        if self.force:
            return FakeBuild(new_mode(), "--fake: the model and inputs were built and traced with fake tensors")
        if not self.auto:
            return None
        found = self.footprint(factory, args, input_bytes)
        if found is None or not found.too_big():
            return None
        reason = (f"traced with fake tensors (no memory allocated): the meta pre-pass found that the "
                  f"{found.describe()}; --no-fake forces real tensors")
        log.warning("%s", reason)
        return FakeBuild(new_mode(), reason)

    def footprint(self, factory: Callable, args: dict[str, Any], input_bytes: int = 0) -> Footprint | None:
        """Build the model on the meta device and size it with the --input tensors; None when the factory
        can't run there and no --input is given."""
        nbytes = meta_param_bytes(factory, args, self.dtype)
        if nbytes is None and not input_bytes:
            return None
        return Footprint(nbytes or 0, 1 if self.inference else STATE_COPIES, available_ram(), input_bytes)


def new_mode(crosscheck: bool = False) -> FakeTensorMode:
    """A FakeTensorMode that accepts real tensors (module constants), gives data-dependent results
    (nonzero, .item()) symbolic sizes instead of failing, and serves repeated calls fast (fast_fake.py)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv  # sympy: imported only for fake runs

    from opscan.trace.fast_fake import FastFakeMode

    return FastFakeMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), crosscheck=crosscheck)


def meta_param_bytes(factory: Callable, args: dict[str, Any], dtype: str | None = None) -> int | None:
    """Bytes of the model's distinct parameters, built under torch.device("meta") (None on failure)."""
    try:
        with torch.device("meta"):
            result = factory(**args)
    except Exception as exc:  # noqa: BLE001 - a factory that can't run on meta is just not sized
        log.debug("meta pre-pass skipped: %s: %s", type(exc).__name__, exc)
        return None
    model = result[0] if isinstance(result, tuple) and result else result
    if not isinstance(model, torch.nn.Module):
        return None
    size = getattr(torch, dtype).itemsize if dtype else None
    return sum(p.numel() * (size or p.element_size()) for p in model.parameters())


def available_ram() -> int:
    """MemAvailable from /proc/meminfo, else physical RAM (bytes)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@contextlib.contextmanager
def entered(build: FakeBuild | None):
    """Inside the build's fake mode, with torch's foreach paths open to fake tensors and the step's DataLoaders
    run in this process (their workers cannot take fake tensors: target/loaders.py); no-op for real ones."""
    from opscan.target.loaders import in_process_loaders

    if build is None:
        yield
        return
    with build.mode, _foreach_as_real(), in_process_loaders():
        yield


@contextlib.contextmanager
def _foreach_as_real():
    """clip_grad_norm_, GradScaler and the optimizers take their foreach path only for the tensor types
    listed in `_foreach_supported_types`, so a fake tensor would take the per-tensor loop a real CPU
    tensor doesn't. Listed while tracing, as torch.distributed.tensor lists DTensor."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    lists = [types for types in (_foreach_utils._foreach_supported_types, optimizer._foreach_supported_types)
             if FakeTensor not in types]
    for types in lists:
        types.append(FakeTensor)
    try:
        yield
    finally:
        for types in lists:
            types.remove(FakeTensor)


@contextlib.contextmanager
def stop_on_data_dependence(notes: list[str], calls: list):
    """Stop the step where fake tensors lack a value; keep the calls so far and say why in `notes`."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        yield
    except (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException,
            UnsupportedOperatorException) as exc:
        del calls[next((i for i, c in enumerate(calls) if c is None), len(calls)):]  # calls cut short
        where = calls[-1] if calls else None
        after = f" after {where.op.display} (module {where.module or '(model)'}, {where.phase})" if where else ""
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        notes.append(
            f"fake tensors: the step stopped{after}: {type(exc).__name__}: {first} — the code needs a tensor "
            "value fake tensors don't have; the calls before it are reported, the rest of the step is not "
            "(scan a smaller config with real tensors, --no-fake, to see it)")
        log.warning("%s", notes[-1])


def unknown_sizes(calls) -> list[str]:
    """A note when recorded sizes depend on tensor values (nonzero, masks, .item()): they read -1."""
    count = sum(1 for c in calls if c is not None and any(-1 in t.shape for t in (*c.inputs, *c.outputs)))
    if not count:
        return []
    return [f"fake tensors: {count} calls have sizes that depend on tensor values (nonzero, masks, .item() "
            "used as a size); fake tensors don't know them, so they are recorded as -1"]
