"""Graph stage: the lane — mac-first, dual-track or linux-gpu-first — from the rows' verdicts, the transfers and
the memory fit (contract, "Lanes").

Rows are anything with `op`, `dtypes`, `verdict` and `evidence` (report.Row). The transfer rule: linux-gpu-first
when the CPU fallback would move more bytes per step (both directions) than the step's parameters and activations
together; its reasons name the total, the footprint and the rows whose calls move the most.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from opscan.graph.transfers import Transfers
from opscan.opkey import signature_text
from opscan.units import human_bytes
from opscan.verdict import Source, Verdict


class LaneName(str, enum.Enum):
    """The three lanes (contract, "Lanes")."""

    MAC_FIRST = "mac-first"
    DUAL_TRACK = "dual-track"
    LINUX_GPU_FIRST = "linux-gpu-first"

    def __str__(self) -> str:
        return self.value


LANES = tuple(lane.value for lane in LaneName)  # best first: mac-first, dual-track, linux-gpu-first


class ReasonKind(str, enum.Enum):
    """What a lane reason rests on."""

    ROW = "row"  # a report row's verdict (the scan), or an op that fell back (accept); "all rows native" too
    TRANSFER = "transfer"  # bytes the step copies between host and device
    MEMORY = "memory"  # the memory estimate's fit on Macs
    COMPARISON = "comparison"  # accept: a comparison with the reference failed
    # the scan: host tensors the user's code hands MPS kernels (report/placement.py), which never decide the lane;
    # accept: parameters or optimizer state off the target device
    PLACEMENT = "placement"
    DEVICE = "device"  # accept: which device was measured, and what that says about MPS

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Reason:
    """One reason of a lane: its kind, the report row it cites (an index into `ops`, or None) and its text."""

    kind: ReasonKind
    text: str
    row: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (report.json `lane.why`)."""
        return {"kind": self.kind.value, "row": self.row, "text": self.text}


@dataclass(frozen=True)
class Lane:
    """The platform decision, the reasons that decided it, and whether it rests on predicted or measured
    verdicts (`source`, as a row's)."""

    name: LaneName
    why: tuple[Reason, ...]
    source: Source = Source.PREDICTED

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", LaneName(self.name))

    @property
    def reasons(self) -> tuple[str, ...]:
        """The reasons' texts (report.json `lane.reasons`, as in schema v1)."""
        return tuple(r.text for r in self.why)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: `reasons` (texts) and, beside them, `why` (kind, row, text) and `source`."""
        return {"name": self.name.value, "reasons": list(self.reasons), "why": [r.to_dict() for r in self.why],
                "source": self.source.value}


def transfer_reasons(t: Transfers, rows: tuple, top: int = 5) -> tuple[Reason, ...]:
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
    return (Reason(ReasonKind.TRANSFER, head), *(_moves(rows, i, b, calls) for i, (b, calls) in ranked))


def _moves(rows: tuple, i: int, moved: int, calls: int) -> Reason:
    row = rows[i]
    return Reason(ReasonKind.TRANSFER, f"{row.op.display} [{signature_text(row.dtypes)}] is {row.verdict.value}: "
                                       f"moves {human_bytes(moved)} per step in {calls} calls", i)


_LINUX = {Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT, Verdict.MISMATCH}
_DUAL = {Verdict.CPU_FALLBACK, Verdict.UNSUPPORTED, Verdict.UNSUPPORTED_DTYPE, Verdict.UNKNOWN}


def decide_lane(rows: tuple, heavy: tuple[Reason, ...] = (), memory: dict[str, str] | None = None,
                source: Source = Source.PREDICTED) -> Lane:
    """mac-first / dual-track / linux-gpu-first per the contract, listing the deciding rows.

    `heavy`: reasons from the transfer rule (lanes.transfer_reasons), when the CPU fallback would move
    more bytes per step than the step's parameters and activations; they make the lane linux-gpu-first.
    `memory`: the memory section's lane effect `{fit, reason}` (memory/section.py), when estimated:
    `does_not_fit` (no Mac) makes it linux-gpu-first, `tight` (on every Mac it runs on) dual-track;
    mac-first needs `fits`, and lists it. `source`: whether the rows' verdicts are predicted or measured.
    """
    fit = (memory or {}).get("fit")
    why = lambda level: (Reason(ReasonKind.MEMORY, memory["reason"]),) if fit == level else ()  # noqa: E731
    placed = placement_reasons(rows)
    linux = [(i, r) for i, r in enumerate(rows) if _lane_verdict(r) in _LINUX]
    if linux or heavy or fit == "does_not_fit":
        return Lane(LaneName.LINUX_GPU_FIRST, (*placed, *_cited(linux), *heavy, *why("does_not_fit")), source)
    dual = [(i, r) for i, r in enumerate(rows) if _lane_verdict(r) in _DUAL]
    if dual or fit == "tight":
        return Lane(LaneName.DUAL_TRACK, (*placed, *_cited(dual), *why("tight")), source)
    native = sum(1 for r in rows if getattr(r, "placement", None) is None)
    return Lane(LaneName.MAC_FIRST, (*placed, Reason(ReasonKind.ROW, f"all {native} other rows are native" if placed
                                                     else f"all {len(rows)} rows are native"), *why("fits")), source)


def _lane_verdict(row) -> Verdict:
    """A row's verdict for the lane: apart from its placement findings (a bug of the user's code, not of MPS)."""
    return getattr(row, "lane_verdict", row.verdict)


FIXES_LEAD = "once the"  # how the placement model's lane reason begins (is_host_reason)


def is_host_reason(reason: Reason) -> bool:
    """Whether a lane reason is the placement model's (host tensors), not another `placement` one (code that picks
    a device, report/device_code.py; accept's)."""
    return reason.kind == ReasonKind.PLACEMENT and reason.row is None and (
        reason.text.startswith(FIXES_LEAD) or " host tensor" in reason.text.split(";", 1)[0])


def placement_reasons(rows) -> tuple[Reason, ...]:
    """The lane's placement reason: the host tensors the user's code hands MPS kernels (report/placement.py: each a
    finding at the line that made it, its row's `causes`), which the lane is decided without; () when there are
    none."""
    errors, open_ = {}, {}
    for row in rows:
        found = getattr(row, "placement", None)
        if found is None:
            continue
        into = errors if found["verdict"] == Verdict.ERROR.value else open_
        for o in getattr(row, "causes", ()):
            into.setdefault((o.get("file"), o.get("line"), o.get("name")), None)
    open_ = {k: None for k in open_ if k not in errors}
    if not errors and not open_:
        return ()
    parts = []
    if errors:
        n = len(errors)
        parts.append(f"{FIXES_LEAD} {n} placement fix{'es' if n > 1 else ''} {'are' if n > 1 else 'is'} made "
                     f"(your step as written raises on a Mac)")
    if open_:
        n = len(open_)
        parts.append(f"{n} host tensor{'s' if n > 1 else ''} reach{'' if n > 1 else 'es'} MPS kernels that may refuse "
                     f"{'them' if n > 1 else 'it'} (not established: see the placement findings)")
    return (Reason(ReasonKind.PLACEMENT, "; ".join(parts)),)


def _cited(rows) -> tuple[Reason, ...]:
    return tuple(Reason(ReasonKind.ROW, reason_of(r), i) for i, r in rows)


def reason_of(row) -> str:
    """The lane reason a row gives: its op, signature, verdict and evidence."""
    return f"{row.op.display} [{signature_text(row.dtypes)}] is {row.verdict.value}: {row.evidence.text}"
