"""Report stage: one immutable `Report` built from the trace's rows and their classifications.

Pure data, no torch: reporters and the CLI read it; `to_dict()` is the report JSON (schema v1,
documented in the README and in opscan/schema/report-v1.json).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opscan.opkey import OpKey
from opscan.verdict import Classification, Evidence, Source, Verdict

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Row:
    """One (OpKey, input-dtype signature) of the step, with its verdict and where it was seen."""

    op: OpKey
    dtypes: tuple[str, ...]
    verdict: Verdict
    source: Source
    evidence: Evidence
    remedy: str | None
    since: str | None
    cpu_op: OpKey | None
    phases: tuple[str, ...]
    modules: tuple[str, ...]
    calls: int
    shapes: tuple[tuple[int, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (contract field names)."""
        return {
            "op": self.op.op,
            "overload": self.op.overload,
            "dtypes": list(self.dtypes),
            "verdict": self.verdict.value,
            "source": self.source.value,
            "evidence": self.evidence.to_dict(),
            "remedy": self.remedy,
            "since": self.since,
            "cpu_op": self.cpu_op.display if self.cpu_op else None,
            "phases": list(self.phases),
            "modules": list(self.modules),
            "calls": self.calls,
            "shapes": [list(s) for s in self.shapes],
        }


@dataclass(frozen=True)
class Lane:
    """The platform decision and the rows that decided it."""

    name: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"name": self.name, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Report:
    """Everything a scan found; reporters are pure functions of this object."""

    opscan_version: str
    kb_version: str
    model: str
    model_name: str
    mode: str
    assumptions: dict[str, Any]
    environment: dict[str, Any]
    phases: dict[str, dict[str, int]]
    rows: tuple[Row, ...]
    lane: Lane
    trace: dict[str, Any]
    modules: tuple[tuple[str, str], ...] = ()
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, dict[str, int]]:
        """Per verdict: distinct rows (`ops`) and calls; every verdict present, unknown included."""
        out = {v.value: {"ops": 0, "calls": 0} for v in Verdict}
        for row in self.rows:
            out[row.verdict.value]["ops"] += 1
            out[row.verdict.value]["calls"] += row.calls
        return out

    def worst(self) -> Verdict:
        """The most severe verdict among the rows (native when there are none)."""
        return max((r.verdict for r in self.rows), key=lambda v: v.rank, default=Verdict.NATIVE)

    def to_dict(self) -> dict[str, Any]:
        """The report JSON, schema v1."""
        return {
            "schema_version": self.schema_version,
            "opscan_version": self.opscan_version,
            "kb_version": self.kb_version,
            "model": self.model,
            "model_name": self.model_name,
            "mode": self.mode,
            "assumptions": self.assumptions,
            "environment": self.environment,
            "phases": self.phases,
            "trace": self.trace,
            "ops": [r.to_dict() for r in self.rows],
            "summary": self.summary,
            "lane": self.lane.to_dict(),
            "modules": [{"path": p, "type": t} for p, t in self.modules],
            **self.extra,
        }


@dataclass(frozen=True)
class RowUse:
    """How one (OpKey, dtypes) was used in the step, gathered by the scan from its calls."""

    op: OpKey
    dtypes: tuple[str, ...]
    cpu_op: OpKey | None
    phases: tuple[str, ...]
    modules: tuple[str, ...]
    calls: int
    shapes: tuple[tuple[int, ...], ...]


def make_row(use: RowUse, found: Classification, source: Source = Source.PREDICTED) -> Row:
    """Join a row's use with its classification."""
    return Row(
        op=use.op, dtypes=use.dtypes, verdict=found.verdict, source=source,
        evidence=found.evidence, remedy=found.remedy, since=found.since, cpu_op=use.cpu_op,
        phases=use.phases, modules=use.modules, calls=use.calls, shapes=use.shapes,
    )


_LINUX = {Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT, Verdict.MISMATCH}
_DUAL = {Verdict.CPU_FALLBACK, Verdict.UNSUPPORTED, Verdict.UNSUPPORTED_DTYPE, Verdict.UNKNOWN}


def decide_lane(rows: tuple[Row, ...]) -> Lane:
    """mac-first / dual-track / linux-gpu-first per the contract, listing the deciding rows."""
    linux = [r for r in rows if r.verdict in _LINUX]
    if linux:
        return Lane("linux-gpu-first", tuple(_reason(r) for r in linux))
    dual = [r for r in rows if r.verdict in _DUAL]
    if dual:
        return Lane("dual-track", tuple(_reason(r) for r in dual))
    return Lane("mac-first", (f"all {len(rows)} rows are native",))


def _reason(row: Row) -> str:
    return f"{row.op.display} [{signature_text(row.dtypes)}] is {row.verdict.value}: {row.evidence.text}"


def signature_text(dtypes: tuple[str, ...]) -> str:
    """A dtype signature in short but lossless form: ("float32", "float32", "int64") -> "float32×2,int64".

    Rows are keyed by the whole signature, so two rows of one op must never print alike.
    """
    runs: list[list] = []
    for dtype in dtypes:
        if runs and runs[-1][0] == dtype:
            runs[-1][1] += 1
        else:
            runs.append([dtype, 1])
    return ",".join(d if n == 1 else f"{d}×{n}" for d, n in runs) or "-"


def count_phases(calls) -> dict[str, dict[str, int]]:
    """Per phase: top-level device-work calls and bookkeeping calls (composite callees excluded)."""
    work = Counter(c.phase for c in calls if not c.bookkeeping and c.parent is None)
    books = Counter(c.phase for c in calls if c.bookkeeping)
    phases = dict.fromkeys([*work, *books])
    return {p: {"calls": work.get(p, 0), "bookkeeping": books.get(p, 0)} for p in phases}
