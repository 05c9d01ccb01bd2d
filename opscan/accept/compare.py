"""Accept stage (compare): target against reference, tensor by tensor, and the first divergence.

Each pair is compared in float64 on the CPU (spec.py says how: RMS and norm-relative differences,
with the largest elementwise difference kept for the table). The comparisons keep the order of the
run — iteration, then kind (spec.KINDS), then tensor (gradients in backward order) — so the first one
beyond tolerance is the first divergence. When it is an output, the module is localised: the first
module, in the order the forward finished them, whose own output is beyond the output tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from opscan.accept.spec import KINDS, AcceptSpec, Tolerance


@dataclass(frozen=True)
class Comparison:
    """One compared tensor: its errors, the tolerance it was held to, and whether it passed."""

    iteration: int
    kind: str
    name: str
    module: str
    abs_err: float  # RMS of the difference
    rel_err: float  # ‖difference‖₂ / ‖reference‖₂
    max_abs_err: float
    atol: float
    rtol: float
    ok: bool
    pair: str = "target-vs-reference"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (non-finite errors as strings)."""
        return {"iteration": self.iteration, "kind": self.kind, "name": self.name, "module": self.module,
                "abs_err": _json_float(self.abs_err), "rel_err": _json_float(self.rel_err),
                "max_abs_err": _json_float(self.max_abs_err), "atol": self.atol, "rtol": self.rtol,
                "ok": self.ok, "pair": self.pair, "note": self.note}

    def line(self) -> str:
        """'iteration 1, gradient fc.weight (module fc): rel 2.1e-02 > rtol 1e-03, rms 3.0e-04 > atol 1e-06'."""
        where = f"module {self.module}" if self.module else "module ?"
        when = f"iteration {self.iteration}"
        if self.pair != "target-vs-reference":
            when = "reloaded state" if self.kind == "reload" else f"step {self.iteration} after the reload"
        text = (f"{when}, {self.kind} {self.name} ({where}): rel {self.rel_err:.1e} > rtol "
                f"{self.rtol:g}, rms {self.abs_err:.1e} > atol {self.atol:g}, max abs {self.max_abs_err:.1e}")
        return f"{text} [{self.pair}]" + (f" — {self.note}" if self.note else "")


def errors(target: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float]:
    """(RMS difference, norm-relative difference, largest absolute difference), in float64."""
    if target.shape != reference.shape:
        return math.inf, math.inf, math.inf
    if target.dtype == reference.dtype and torch.equal(target, reference):
        return 0.0, 0.0, 0.0  # bit-identical (a copy, a deterministic device against itself): no float64 pass
    a, b = target.double(), reference.double()
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    odd_a, odd_b = (t[~f].nan_to_num(0.0, 1.0, -1.0) for t, f in ((a, finite_a), (b, finite_b)))
    if not torch.equal(finite_a, finite_b) or not torch.equal(odd_a, odd_b):
        return math.inf, math.inf, math.inf  # a NaN or inf on one side only (NaN and inf in the same places match)
    diff = (a - b)[finite_a]
    if diff.numel() == 0:
        return 0.0, 0.0, 0.0
    norm = diff.norm().item()
    ref_norm = b[finite_b].norm().item()
    rel = norm / ref_norm if ref_norm > 0 else (0.0 if norm == 0 else math.inf)
    return norm / math.sqrt(diff.numel()), rel, diff.abs().max().item()


def judge(abs_err: float, rel_err: float, tolerance: Tolerance) -> bool:
    """Within tolerance: RMS ≤ atol or norm-relative ≤ rtol."""
    return abs_err <= tolerance.atol or rel_err <= tolerance.rtol


def compare_pair(iteration: int, kind: str, name: str, module: str, target: torch.Tensor,
                 reference: torch.Tensor, tolerance: Tolerance, pair: str = "target-vs-reference") -> Comparison:
    """One Comparison of two captured tensors."""
    abs_err, rel_err, max_abs = errors(target, reference)
    note = "" if target.shape == reference.shape else f"shape {tuple(target.shape)} vs {tuple(reference.shape)}"
    return Comparison(iteration, kind, name, module, abs_err, rel_err, max_abs, tolerance.atol, tolerance.rtol,
                      judge(abs_err, rel_err, tolerance), pair, note)


def compare_runs(target, reference, spec: AcceptSpec, stopped: bool = False) -> tuple[Comparison, ...]:
    """Every captured tensor of either run against the other's, in run order, over the union of both runs'
    tensors: one that a side lacks (a .grad that is None there, a missing output) fails, named.

    stopped: the target run stopped on an exception (DeviceRun.failure) — only what it captured before is
    compared; the tensors it never reached are not reported missing (the failure says why)."""
    mine = {(c.iteration, c.kind, c.name): c for c in target.captured}
    theirs = {(c.iteration, c.kind, c.name): c for c in reference.captured}
    found = []
    for key, c in _union(target.captured, reference.captured, stopped):
        if key not in theirs or key not in mine:
            side = "reference" if key not in theirs else "target"
            found.append(missing(c, f"missing on the {side} (the {_other(side)} has it)"))
            continue
        found.append(compare_pair(c.iteration, c.kind, c.name, c.module, mine[key].tensor, theirs[key].tensor,
                                  spec.tolerance(target.dtype, c.kind)))
    return tuple(localise(c, target, reference, spec) for c in found)


def missing(c, note: str, pair: str = "target-vs-reference") -> Comparison:
    """A failed Comparison for a tensor (a Captured) that one side of a pair does not have."""
    return Comparison(c.iteration, c.kind, c.name, c.module or "(model)", math.inf, math.inf, math.inf, 0.0, 0.0,
                      False, pair, note)


def _union(target: tuple, reference: tuple, stopped: bool) -> list:
    """((iteration, kind, name), Captured) over both runs in run order (the target's capture order first)."""
    keyed = {}
    for position, c in enumerate(target):
        keyed.setdefault((c.iteration, c.kind, c.name), (0, position, c))
    if not stopped:
        for position, c in enumerate(reference):
            keyed.setdefault((c.iteration, c.kind, c.name), (1, position, c))
    order = sorted(keyed.items(), key=lambda kv: (kv[0][0], KINDS.index(kv[0][1]), kv[1][1], kv[1][0]))
    return [(key, c) for key, (_, _, c) in order]


def _other(side: str) -> str:
    return "target" if side == "reference" else "reference"


def first_divergence(comparisons: tuple[Comparison, ...]) -> Comparison | None:
    """The first comparison beyond tolerance (run order), or None."""
    return next((c for c in comparisons if not c.ok), None)


def localise(c: Comparison, target, reference, spec: AcceptSpec) -> Comparison:
    """Name the module of a failing output/eval comparison: the first module whose output diverges."""
    if c.ok or c.kind not in ("output", "eval") or c.module:
        return c
    key = "eval" if c.kind == "eval" else c.iteration
    mine, theirs = target.module_outputs.get(key, {}), reference.module_outputs.get(key, {})
    tolerance = spec.tolerance(target.dtype, "output")
    for path, tensor in mine.items():
        if path in theirs and not judge(*errors(tensor, theirs[path])[:2], tolerance):
            return _with_module(c, path)
    return _with_module(c, "(model)")


def _with_module(c: Comparison, module: str) -> Comparison:
    from dataclasses import replace

    return replace(c, module=module)


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
