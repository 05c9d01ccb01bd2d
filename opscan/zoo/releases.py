"""One model's step, judged for every release: its lane, whether the whole step is native, and the rows that
block it, each with its evidence (ReleaseResult).

`scan_releases(options, releases)` is the one entry point the zoo uses. It traces the step once and judges every
release from that trace: the MPS view, the predictions, the step graph and the lane are made per release, the
target and its trace are not. A trace depends on its release only through the questions it asked of it
(opscan/trace/questions.py: which ops have an MPS kernel, which composites to expand, the macOS); a release that
answers one of them differently gets a trace of its own, so the result of every release is exactly the one a
`--torch-version R` scan gives (`result_of(scan(...))`, the yardstick tests/test_zoo_releases.py holds it to).
A transformer usually takes two traces (before and after 2.5, where the attention math path's `_safe_softmax`
appears), a CNN one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from opscan.verdict import Verdict


@dataclass(frozen=True)
class BlockingRow:
    """One non-native row of a release's step: op, dtypes, verdict, and the rule and text of its evidence."""

    op: str
    dtypes: tuple[str, ...]
    verdict: str
    rule: str
    evidence: str
    source: str  # where the fact comes from (the evidence's source)
    verdict_source: str  # "predicted" | "measured"

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"op": self.op, "dtypes": list(self.dtypes), "verdict": self.verdict, "rule": self.rule,
                "evidence": self.evidence, "source": self.source, "verdict_source": self.verdict_source}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BlockingRow":
        """The row to_dict wrote."""
        return cls(data["op"], tuple(data["dtypes"]), data["verdict"], data["rule"], data["evidence"],
                   data["source"], data["verdict_source"])


@dataclass(frozen=True)
class ReleaseResult:
    """A model's step as predicted (or measured) for one release."""

    release: str
    lane: str  # LaneName value
    lane_why: tuple[str, ...]
    native: bool  # every row native
    blocking: tuple[BlockingRow, ...]
    rows: int
    # how the result was made, not what it says (equality ignores them): which of the model's traces judged this
    # release (0-based; releases with the same number share it), how many traces all its releases took, and the
    # seconds that trace took (loading the target and tracing its step)
    trace: int = field(default=0, compare=False)
    traces: int = field(default=1, compare=False)
    trace_seconds: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"release": self.release, "lane": self.lane, "lane_why": list(self.lane_why), "native": self.native,
                "blocking": [b.to_dict() for b in self.blocking], "rows": self.rows, "trace": self.trace,
                "traces": self.traces, "trace_seconds": round(self.trace_seconds, 3)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReleaseResult":
        """The result to_dict wrote (one written before `trace`, `traces`, `trace_seconds` existed reads as one
        trace of unknown seconds)."""
        return cls(data["release"], data["lane"], tuple(data["lane_why"]), bool(data["native"]),
                   tuple(BlockingRow.from_dict(b) for b in data["blocking"]), int(data["rows"]),
                   int(data.get("trace", 0)), int(data.get("traces", 1)), float(data.get("trace_seconds", 0.0)))


def result_of(report, release: str) -> ReleaseResult:
    """The ReleaseResult of one Report (a scan predicted for `release`)."""
    blocking = tuple(
        BlockingRow(str(row.op), tuple(row.dtypes), row.verdict.value, row.evidence.rule, row.evidence.text,
                    row.evidence.source, row.source.value)
        for row in report.rows if row.verdict is not Verdict.NATIVE)
    return ReleaseResult(release, report.lane.name.value, report.lane.reasons, not blocking, blocking,
                         len(report.rows))


def scan_releases(options, releases: tuple[str, ...] | None = None, ctx=None) -> dict[str, ReleaseResult]:
    """{release: ReleaseResult} for `options` (a ScanOptions; its torch_version is ignored, the memory estimate is
    off) and every release in `releases` (default: every release the knowledge base holds), from as few traces as
    the releases' answers allow (see the module docstring); `ctx`: the run's RunContext (target/run.py)."""
    from opscan.knowledge import kb_releases, load_knowledge
    from opscan.scan import scan

    base = replace(options, memory=False)
    traced: list[tuple[Any, float]] = []  # (Prepared, seconds), one per trace made
    judged: dict[str, ReleaseResult] = {}
    for release in tuple(releases) if releases else kb_releases():
        kb = load_knowledge(yaml_path=options.yaml_path, release=release, macos=options.macos,
                            chip=getattr(options, "chip", None))
        index = trace_serving(traced, kb, replace(base, torch_version=release), ctx)
        prepared, seconds = traced[index]
        report = scan(replace(base, torch_version=release), prepared=replace(prepared, kb=kb), ctx=ctx)
        judged[release] = replace(result_of(report, release), trace=index, trace_seconds=seconds)
    return {release: replace(found, traces=len(traced)) for release, found in judged.items()}


def trace_serving(traced: list, kb, options, ctx=None) -> int:
    """The index in `traced` ((Prepared, seconds) per trace made) of the trace that serves `kb`'s release: the
    first one that release would make identically, else a new trace of `options` appended."""
    index = _serving(traced, kb)
    if index is None:
        traced.append(_traced(options, ctx))
        index = len(traced) - 1
    return index


def _serving(traced: list, kb) -> int | None:
    """The index of the first trace made so far that `kb`'s release would make identically, else None."""
    from opscan.opkey import Release
    from opscan.predict.calls import amp_of, has_mps_kernel, should_expand
    from opscan.trace.questions import Questions, answers_equal

    release = Questions(has_mps_kernel(kb), should_expand(kb), kb.macos, amp_of(kb),
                        Release.parse(kb.release).series_key)
    return next((i for i, (prepared, _) in enumerate(traced) if answers_equal(prepared.trace.asked, release)), None)


def _traced(options, ctx) -> tuple[Any, float]:
    """The target loaded afresh and its step traced for options.torch_version (scan.prepare), with the seconds."""
    from opscan.scan import prepare

    start = time.perf_counter()
    prepared = prepare(options, ctx)
    return prepared, time.perf_counter() - start
