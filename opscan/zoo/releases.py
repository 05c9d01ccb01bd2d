"""One model's step, judged for every release: its lane, whether the whole step is native, and the rows that
block it, each with its evidence (ReleaseResult).

`scan_releases(options, releases)` is the one entry point the zoo uses. This first version scans once per release
(a whole `--torch-version R` scan each, memory off): correct by construction, and the yardstick that the single-
trace version must equal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class ReleaseResult:
    """A model's step as predicted (or measured) for one release."""

    release: str
    lane: str  # LaneName value
    lane_why: tuple[str, ...]
    native: bool  # every row native
    blocking: tuple[BlockingRow, ...]
    rows: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"release": self.release, "lane": self.lane, "lane_why": list(self.lane_why), "native": self.native,
                "blocking": [b.to_dict() for b in self.blocking], "rows": self.rows}


def result_of(report, release: str) -> ReleaseResult:
    """The ReleaseResult of one Report (a scan predicted for `release`)."""
    blocking = tuple(
        BlockingRow(str(row.op), tuple(row.dtypes), row.verdict.value, row.evidence.rule, row.evidence.text,
                    row.evidence.source, row.source.value)
        for row in report.rows if row.verdict is not Verdict.NATIVE)
    return ReleaseResult(release, report.lane.name.value, report.lane.reasons, not blocking, blocking,
                         len(report.rows))


def scan_releases(options, releases: tuple[str, ...] | None = None) -> dict[str, ReleaseResult]:
    """{release: ReleaseResult} for `options` (a ScanOptions; its torch_version is ignored) and every release in
    `releases` (default: every release the knowledge base holds)."""
    from opscan.knowledge import kb_releases
    from opscan.scan import scan

    chosen = tuple(releases) if releases else kb_releases()
    return {release: result_of(scan(replace(options, torch_version=release, memory=False)), release)
            for release in chosen}
