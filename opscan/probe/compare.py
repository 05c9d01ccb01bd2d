"""Probe stage (worker side): a probe's outputs against its CPU reference, as a `Comparison` record.

The rule itself — tolerances, what is compared elementwise and what by its properties — is comparison.py's,
the one source shared with every repro script; this module only turns its answer into the protocol's record.
The reference is the same call on the CPU with floating inputs cast to float64 (complex to complex128); when
the op refuses float64 it is the same call on the CPU in the probe's dtypes (`reference: "same-dtype"`).
"""

from __future__ import annotations

import math

from opscan.probe import comparison
from opscan.probe.protocol import Comparison


def compare(func, got: list, ref: list, dtypes, reference: str) -> Comparison:
    """Compare the probe's outputs `got` with `ref` (both on the CPU), leaf by leaf; an op with no output to
    compare is unchecked (`within` None), not within tolerance."""
    problem, err_abs, err_rel, _, how = comparison.compare(func, dtypes, got, ref)
    if problem is None and how == "none":
        return Comparison("none", None, reference=reference, detail="the call has no output to compare")
    return Comparison(how, problem is None, _finite(err_abs), _finite(err_rel), reference, problem)


def unchecked(why: str) -> Comparison:
    """The record of a pass whose outputs could not be compared (no CPU reference): unchecked, never within."""
    return Comparison("none", None, reference="none", detail=f"no CPU reference: {why}")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
