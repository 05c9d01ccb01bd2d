"""Render stage: the report as GitHub Actions workflow commands, one annotation per finding row.

`::error file=examples/tricky.py,line=56,title=…::message`, `::warning …`, `::notice …`: the level is the
finding's SARIF level (render/sarif.py: error, warning, note -> notice), the place the first line of the user's
code that made the row's calls (its `where`; a row no line of the user's code made is annotated without a file),
most severe first (ties in step order). GitHub shows at most 10 error, 10 warning and 10 notice annotations per
step (`PER_LEVEL`): no more are written, and when any finding is left out a last notice counts them by level and
points at the full report. Data is escaped as the Actions toolkit does (`%`, CR, LF as %25, %0D, %0A), properties
also their `:` and `,` (%3A, %2C), control characters visible (opscan/trust/text.py github_data, github_property),
so a message or file name cannot end the command early or forge another.
"""

from __future__ import annotations

from collections import Counter

from opscan.opkey import signature_text
from opscan.render.sarif import level_of, message
from opscan.report import Report, Row
from opscan.trust.text import github_data, github_property

PER_LEVEL = 10  # annotations of one level GitHub shows per step
COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def workflow_command(level: str, message_text: str, **properties) -> str:
    """One workflow command line (properties in the order given, None ones left out)."""
    props = ",".join(f"{key}={github_property(value)}" for key, value in properties.items() if value is not None)
    return f"::{level}{' ' + props if props else ''}::{github_data(message_text)}"


def render_github(report: Report, **_) -> str:
    """The annotations, most severe first, within GitHub's per-step limits."""
    findings = report.findings
    if not findings:
        text = f"no findings: every op of the step is native on MPS (lane {report.lane.name})"
        return workflow_command("notice", text, title="opscan") + "\n"
    levels = [COMMANDS[level_of(r.verdict)] for r in findings]
    total = Counter(levels)
    left = sum(max(0, n - PER_LEVEL) for n in total.values())
    room = {level: PER_LEVEL - (level == "notice" and left > 0) for level in COMMANDS.values()}
    shown: Counter = Counter()
    lines = []
    for row, level in zip(findings, levels):
        if shown[level] < room[level]:
            shown[level] += 1
            lines.append(_annotation(row, level, report))
    skipped = total - shown
    if skipped:
        counts = ", ".join(f"{n} {level}{'s' * (n != 1)}" for level, n in skipped.items())
        text = (f"{sum(skipped.values())} more findings not annotated ({counts}): GitHub shows {PER_LEVEL} "
                "annotations of each level per step — see the full report (-f json, or report.html)")
        lines.append(workflow_command("notice", text, title="opscan: more findings"))
    return "\n".join(lines) + "\n"


def _annotation(row: Row, level: str, report: Report) -> str:
    place = next((p for p in row.where if p.get("file")), None)
    others = [f"{p['file']}:{p['line']}" for p in row.where if p.get("file") and p is not place]
    text = message(row, report) + (f" Also called from {', '.join(others)}." if others else "")
    title = f"opscan: {row.op.display} [{signature_text(row.dtypes)}] {row.verdict.value} on MPS"
    if place is None:
        return workflow_command(level, text, title=title)
    return workflow_command(level, text, file=place["file"], line=place["line"], title=title)
