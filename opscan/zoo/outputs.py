"""The leaderboard's JSON and CSV, and the diff of two leaderboards: pure functions of Leaderboard objects.

CSV: one row per model x release (a model that could not be scanned: one row, release empty, its reason);
`blocking` lists the blocking rows as "op[dtypes] verdict (rule)" joined by "; ". A text cell that starts with
`=`, `+`, `-`, `@` (a model named `=HYPERLINK(...)`) gets a leading `'`: a spreadsheet shows it, never runs it.

Diff (`opscan zoo diff OLD NEW`): for every model in both and every release in both, a change when the lane
differs (an error row counts as lane "error"), with the blocking rows that appeared and disappeared — keyed by
op, dtypes and verdict, so a row whose verdict changed shows as one gone and one new. Models only on one side
are listed as added or removed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from opscan.opkey import Release
from opscan.trust.text import csv_cell
from opscan.zoo.board import Leaderboard, ModelResult
from opscan.trust.text import strict_json

CSV_COLUMNS = ("model", "family", "status", "release", "lane", "native", "cell_source", "blocking_rows", "blocking",
               "first_native", "seconds", "error")


def render_json(board: Leaderboard) -> str:
    return strict_json(board.to_dict(), indent=1, sort_keys=False) + "\n"


def _row_text(b) -> str:
    return f"{b.op}[{','.join(b.dtypes)}] {b.verdict} ({b.rule})"


def render_csv(board: Leaderboard) -> str:
    out = io.StringIO()
    writer = _Cells(csv.writer(out, lineterminator="\n"))
    writer.writerow(CSV_COLUMNS)
    for m in board.models:
        first = m.first_native(board.releases) or ""
        base = (m.model.name, m.model.source, m.status)
        if m.error:
            writer.writerow((*base, "", "", "", "", "", "", first, f"{m.seconds:.1f}", m.error))
        for c in m.cells:
            r = c.result
            writer.writerow((*base, r.release, r.lane, str(r.native).lower(), c.source, len(r.blocking),
                             "; ".join(_row_text(b) for b in r.blocking), first, f"{m.seconds:.1f}", ""))
    return out.getvalue()


class _Cells:
    """A csv writer whose text cells are neutralised against formula injection (opscan/trust/text.py csv_cell)."""

    def __init__(self, writer):
        self.writer = writer

    def writerow(self, row) -> None:
        self.writer.writerow([csv_cell(v) for v in row])


@dataclass(frozen=True)
class LaneChange:
    """One model's lane at one release, before and after, and the blocking rows behind the change."""

    model: str
    release: str
    old: str
    new: str
    appeared: tuple[str, ...]
    disappeared: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "release": self.release, "old": self.old, "new": self.new,
                "appeared": list(self.appeared), "disappeared": list(self.disappeared)}


@dataclass(frozen=True)
class BoardDiff:
    changes: tuple[LaneChange, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [c.to_dict() for c in self.changes], "added": list(self.added),
                "removed": list(self.removed)}


def _lane_and_rows(m: ModelResult, release: str) -> tuple[str, set[str]] | None:
    if m.error:
        return "error", {f"error: {m.error}"}
    cell = m.cell(release)
    return None if cell is None else (cell.result.lane, {_row_text(b) for b in cell.result.blocking})


def diff(old: Leaderboard, new: Leaderboard) -> BoardDiff:
    """The lanes that changed from `old` to `new`, and why."""
    before, after = {m.model.name: m for m in old.models}, {m.model.name: m for m in new.models}
    releases = sorted(set(old.releases) & set(new.releases), key=Release.parse)
    changes = []
    for name in sorted(set(before) & set(after)):
        for release in releases:
            a, b = _lane_and_rows(before[name], release), _lane_and_rows(after[name], release)
            if a is None or b is None or a[0] == b[0]:
                continue
            changes.append(LaneChange(name, release, a[0], b[0], tuple(sorted(b[1] - a[1])),
                                      tuple(sorted(a[1] - b[1]))))
    return BoardDiff(tuple(changes), tuple(sorted(set(after) - set(before))),
                     tuple(sorted(set(before) - set(after))))


def render_diff(d: BoardDiff) -> str:
    """The diff as text: one block per model and release whose lane changed."""
    lines = [f"{len(d.changes)} lane changes, {len(d.added)} models added, {len(d.removed)} removed"]
    for c in d.changes:
        lines.append(f"{c.model} @ {c.release}: {c.old} -> {c.new}")
        lines += [f"  + {row}" for row in c.appeared] + [f"  - {row}" for row in c.disappeared]
    lines += [f"added: {name}" for name in d.added] + [f"removed: {name}" for name in d.removed]
    return "\n".join(lines) + "\n"
