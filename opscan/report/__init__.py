"""Report stage: one immutable `Report` built from the trace's rows and their classifications.

Pure data, no torch: reporters and the CLI read it; `to_dict()` is the report JSON (schema v4,
documented in docs/report-schema.md and in opscan/schema/report-v4.json). Every section says what it rests on: a row
its `source`, and so do the lane, graph, transfers, upgrade, memory, measurement and repro sections
("predicted" or "measured"); `mode` is predicted, measured (on mps) or simulated (a test double, tests only).
assemble.py builds the Report from a scan's stages (opscan/scan.py calls it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from opscan.graph.lanes import Lane
from opscan.opkey import OpKey
from opscan.report.findings import Finding, build_findings
from opscan.trust.text import strict_json
from opscan.verdict import Classification, Evidence, Source, Verdict

SCHEMA_VERSION = 4  # 2: lane.why (kind, row, text) and lane.source beside lane.reasons; `source` in every section;
# mode "simulated"; measurement.simulated; comparisons may be unchecked (within null) or by shape. 3: a row's `where`
# (the user's lines that made its calls, report/where.py). 4: `findings` (one per cause: the user's line and the
# rule, report/findings.py: a row's, or a line of code no row holds), a `where` entry's `text` and `cell`, a row's
# optional `causes` and `placement` (report/placement.py); `device_code`
SECTIONS = ("graph", "transfers", "upgrade", "memory", "measurement", "repro", "device_code")  # optional, JSON order


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
    predicted: dict[str, Any] | None = None  # measured on MPS: the prediction it replaced ({verdict, evidence})
    measured: dict[str, Any] | None = None  # the probes' measurement (on MPS, or on cpu/cuda beside the prediction)
    silent: dict[str, Any] | None = None  # a known silent bug decided it: the entry and the calls meeting it
    where: tuple[dict[str, Any], ...] = ()  # the user's lines that made its calls, in step order (report/where.py)
    # the placement model decided some of its calls: its verdict and rule for them, and the row's verdict apart from
    # them, which the lane reads (report/placement.py)
    placement: dict[str, Any] | None = None
    # the lines that caused its calls when they are not where the calls were made (a CPU tensor's creation: its
    # finding goes there, report/findings.py); entries shaped like `where`'s (file, line, function, text, ...), a
    # host tensor's with what it is, the fix and where it met MPS kernels (report/placement.py)
    causes: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (contract field names); `predicted`/`measured` only when probes ran, `silent` only when a
        known silent-correctness bug decided the row (predict/silent.py), `placement` only when the placement model
        decided some of its calls (report/placement.py), `causes` only when the row names them."""
        extra = {k: v for k, v in (("predicted", self.predicted), ("measured", self.measured),
                                   ("silent", self.silent), ("placement", self.placement)) if v is not None}
        if self.causes:
            extra["causes"] = [dict(c) for c in self.causes]
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
            "where": [dict(p, phases=list(p["phases"])) for p in self.where],
            **extra,
        }

    @property
    def lane_verdict(self) -> Verdict:
        """The verdict the lane reads: the row's own, or — when the placement model decided some of its calls (a
        bug of the user's code, not a limit of MPS) — its verdict apart from them."""
        return self.verdict if self.placement is None else Verdict(self.placement["hardware_verdict"])

    @property
    def disagrees(self) -> bool:
        """Measured, and the measurement's verdict differs from the prediction's."""
        if self.measured is None:
            return False
        predicted = self.predicted["verdict"] if self.predicted else self.verdict.value
        return self.measured["verdict"] != predicted


@dataclass(frozen=True, repr=False)
class Report:
    """Everything a scan found; reporters are pure functions of this object. Its repr is one line (a notebook
    echoes it); `to_dict()` is the whole."""

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
    graph: dict[str, Any] | None = None  # the step graph: counts, each finding's neighbourhood (graph/views.py)
    transfers: dict[str, Any] | None = None  # host<->device copies per step (transfers.py)
    upgrade: dict[str, Any] | None = None  # which later release makes the rows native (predict/history.py)
    memory: dict[str, Any] | None = None  # the memory estimate and Mac sizing (memory/section.py)
    measurement: dict[str, Any] | None = None  # how the probes ran, measured mode only (probe/reconcile.py)
    repro: dict[str, Any] | None = None  # what the findings' repro scripts need, with --repro (repro/section.py)
    device_code: dict[str, Any] | None = None  # the user's code that picks a device, as a Mac runs it (device_code.py)
    step_graph: Any = field(default=None, repr=False, compare=False)  # the networkx graph, for GraphML only

    @property
    def summary(self) -> dict[str, dict[str, int]]:
        """Per verdict: distinct rows (`ops`) and calls; every verdict present, unknown included."""
        out = {v.value: {"ops": 0, "calls": 0} for v in Verdict}
        for row in self.rows:
            out[row.verdict.value]["ops"] += 1
            out[row.verdict.value]["calls"] += row.calls
        return out

    @property
    def ops(self) -> tuple[Row, ...]:
        """The rows, as the report JSON names them (`ops`): one per (OpKey, input-dtype signature), in step order."""
        return self.rows

    @cached_property
    def findings(self) -> tuple[Finding, ...]:
        """One finding per cause — the user's line and the rule — most severe first, ties in step order
        (report/findings.py): what every view lists."""
        return build_findings(self.rows, self.assumptions.get("torch_release"),
                              (self.device_code or {}).get("findings") or ())

    @property
    def finding_rows(self) -> tuple[Row, ...]:
        """The rows whose verdict ranks above native, most severe first (ties in step order)."""
        return tuple(sorted((r for r in self.rows if r.verdict.rank > 0), key=lambda r: -r.verdict.rank))

    def __repr__(self) -> str:
        rows = sum(1 for r in self.rows if r.verdict.rank > 0)
        return (f"<{type(self).__name__} {self.model}: {self.mode} for torch "
                f"{self.assumptions.get('torch_release')}, lane {self.lane.name}, {len(self.findings)} "
                f"finding{'s' * (len(self.findings) != 1)} ({rows} of {len(self.rows)} rows not native)>")

    def to_json(self, indent: int | None = 2) -> str:
        """The report JSON (schema v4) as strict JSON text (a non-finite number is null: trust/text.py strict_json):
        `json.loads(report.to_json()) == report.to_dict()` when every number is finite."""
        return strict_json(self.to_dict(), indent=indent)

    def worst(self) -> Verdict:
        """The most severe verdict among the rows (native when there are none)."""
        return max((r.verdict for r in self.rows), key=lambda v: v.rank, default=Verdict.NATIVE)

    def to_dict(self) -> dict[str, Any]:
        """The report JSON, schema v4 (SCHEMA_VERSION)."""
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
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "lane": self.lane.to_dict(),
            "modules": [{"path": p, "type": t} for p, t in self.modules],
            **{name: value for name in SECTIONS if (value := getattr(self, name)) is not None},
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
    silent: dict[str, Any] | None = None  # report/silent.py: the silent bug that decided the row, its calls
    where: tuple[dict[str, Any], ...] = ()  # report/where.py
    placement: dict[str, Any] | None = None  # report/placement.py
    causes: tuple[dict[str, Any], ...] = ()  # report/placement.py: the lines that made its host tensors


def make_row(use: RowUse, found: Classification, source: Source = Source.PREDICTED) -> Row:
    """Join a row's use with its classification."""
    return Row(
        op=use.op, dtypes=use.dtypes, verdict=found.verdict, source=source,
        evidence=found.evidence, remedy=found.remedy, since=found.since, cpu_op=use.cpu_op,
        phases=use.phases, modules=use.modules, calls=use.calls, shapes=use.shapes, silent=use.silent,
        where=use.where, placement=use.placement, causes=use.causes,
    )


def count_phases(calls) -> dict[str, dict[str, int]]:
    """Per phase: top-level device-work calls and bookkeeping calls (composite callees excluded)."""
    work = Counter(c.phase for c in calls if not c.bookkeeping and c.parent is None)
    books = Counter(c.phase for c in calls if c.bookkeeping)
    phases = dict.fromkeys([*work, *books])
    return {p: {"calls": work.get(p, 0), "bookkeeping": books.get(p, 0)} for p in phases}


def measured_rows(rows: tuple[Row, ...], measured: dict, stands_for_mps: bool,
                  platform: str | None = None) -> tuple[Row, ...]:
    """Each row with its measurement (`measured` maps (OpKey, dtypes) to objects with verdict, evidence, remedy and
    block; row order is kept: the graph section refers to rows by index).

    Measured on MPS (or a test double of it): the row's verdict, evidence and remedy become the measured ones and
    the prediction moves to `predicted`. Measured on cpu or cuda: the verdict stays predicted for MPS and the
    measurement is only attached (its `device` says where). A row a known silent bug decided that the measurement
    does not find wrong keeps both, and its `silent.not_reproduced` names where (`platform`: macOS and chip)."""
    return tuple(_not_reproduced(_measured_row(r, measured.get((r.op, r.dtypes)), stands_for_mps), platform)
                 for r in rows)


def _not_reproduced(row: Row, platform: str | None) -> Row:
    if row.silent is None or row.measured is None or row.measured.get("verdict") == Verdict.MISMATCH.value:
        return row
    where = f"measured {row.measured.get('verdict')} on {row.measured.get('device')}" + (
        f" ({platform})" if platform else "")
    return replace(row, silent={**row.silent, "not_reproduced": f"{where}: this Mac did not reproduce the "
                                                                f"predicted silent bug silent-bug-{row.silent['id']}"})


def disagreements(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """The rows whose measured verdict differs from their prediction (`measurement.disagreements`)."""
    return [{"row": i, "op": r.op.display, "dtypes": list(r.dtypes),
             "predicted": (r.predicted or {}).get("verdict", r.verdict.value), "measured": r.measured["verdict"]}
            for i, r in enumerate(rows) if r.disagrees]


def _measured_row(row: Row, found, stands: bool) -> Row:
    if found is None:
        return row
    if not stands:
        return replace(row, measured=found.block)
    remedy = row.remedy if found.verdict == row.verdict else found.remedy
    return replace(row, verdict=found.verdict, source=Source.MEASURED, evidence=found.evidence, remedy=remedy,
                   predicted={"verdict": row.verdict.value, "evidence": row.evidence.to_dict()},
                   measured=found.block)
