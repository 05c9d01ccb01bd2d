"""Graph stage: the lane — mac-first, dual-track or linux-gpu-first — from the rows' verdicts, the transfers and
the memory fit (contract, "Lanes").

Rows are anything with `op`, `dtypes`, `verdict` and `evidence` (report.Row). The transfer rule: linux-gpu-first
when the CPU fallback would move more bytes per step (both directions) than the step's parameters and activations
together; its reasons name the total, the footprint and the rows whose calls move the most.
"""

from __future__ import annotations

from collections import defaultdict

from dataclasses import dataclass
from typing import Any

from opscan.graph.transfers import Transfers
from opscan.opkey import signature_text
from opscan.units import human_bytes
from opscan.verdict import Verdict


@dataclass(frozen=True)
class Lane:
    """The platform decision and the rows that decided it."""

    name: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"name": self.name, "reasons": list(self.reasons)}


def transfer_reasons(t: Transfers, rows: tuple, top: int = 5) -> tuple[str, ...]:
    """The reasons for linux-gpu-first from transfers, or () when the rule does not apply."""
    if not t.fallback_exceeds_footprint:
        return ()
    moved = t.total("fallback")
    footprint = t.parameters_bytes + t.activations_bytes
    head = (f"the CPU fallback moves {human_bytes(moved.bytes)} per step ({moved.syncs} syncs), more than the "
            f"step's parameters and activations together ({human_bytes(footprint)})")
    per_row: dict[int, list] = defaultdict(lambda: [0, 0])
    for n in t.nodes:
        if n.kind == "fallback":
            per_row[n.row][0] += n.cost.bytes
            per_row[n.row][1] += 1
    ranked = sorted(per_row.items(), key=lambda kv: -kv[1][0])[:top]
    return (head, *(f"{rows[i].op.display} [{signature_text(rows[i].dtypes)}] is {rows[i].verdict.value}: "
                    f"moves {human_bytes(b)} per step in {calls} calls" for i, (b, calls) in ranked))


_LINUX = {Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT, Verdict.MISMATCH}
_DUAL = {Verdict.CPU_FALLBACK, Verdict.UNSUPPORTED, Verdict.UNSUPPORTED_DTYPE, Verdict.UNKNOWN}


def decide_lane(rows: tuple, heavy: tuple[str, ...] = (), memory: dict[str, str] | None = None) -> Lane:
    """mac-first / dual-track / linux-gpu-first per the contract, listing the deciding rows.

    `heavy`: reasons from the transfer rule (lanes.transfer_reasons), when the CPU fallback would move
    more bytes per step than the step's parameters and activations; they make the lane linux-gpu-first.
    `memory`: the memory section's lane effect `{fit, reason}` (memory/section.py), when estimated:
    `does_not_fit` (no Mac) makes it linux-gpu-first, `tight` (on every Mac it runs on) dual-track;
    mac-first needs `fits`, and lists it.
    """
    fit = (memory or {}).get("fit")
    why = lambda level: ((memory or {})["reason"],) if fit == level else ()  # noqa: E731
    linux = [r for r in rows if r.verdict in _LINUX]
    if linux or heavy or fit == "does_not_fit":
        return Lane("linux-gpu-first", tuple(reason_of(r) for r in linux) + tuple(heavy) + why("does_not_fit"))
    dual = [r for r in rows if r.verdict in _DUAL]
    if dual or fit == "tight":
        return Lane("dual-track", tuple(reason_of(r) for r in dual) + why("tight"))
    return Lane("mac-first", (f"all {len(rows)} rows are native",) + why("fits"))


def reason_of(row) -> str:
    """The lane reason a row gives: its op, signature, verdict and evidence."""
    return f"{row.op.display} [{signature_text(row.dtypes)}] is {row.verdict.value}: {row.evidence.text}"
