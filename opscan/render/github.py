"""Render stage: the report as GitHub Actions workflow commands, one annotation per finding (one per cause: a line of
the user's code and a rule, report/findings.py).

`::error file=examples/tricky.py,line=56,title=…::message`, `::warning …`, `::notice …`: the level is the finding's
SARIF level (render/sarif.py: error, warning, note -> notice), the place its line (a finding no line of the user's
code caused, or made in a notebook's cell, is annotated without a file), the message render/sarif.py's (the ops made
there, why, the fix, upstream), most severe first (ties in step order). GitHub shows at most 10 error, 10 warning
and 10 notice annotations per step (`PER_LEVEL`): no more are written, and when any finding is left out a last
notice counts them by level and points at the full report. Data is escaped as the Actions toolkit does (`%`, CR, LF
as %25, %0D, %0A), properties also their `:` and `,` (%3A, %2C), control characters visible (opscan/trust/text.py
github_data, github_property), so a message or file name cannot end the command early or forge another.
"""

from __future__ import annotations

from collections import Counter

from opscan.render.sarif import level_of, located, message
from opscan.report import Report
from opscan.report.findings import Finding
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
    levels = [COMMANDS[level_of(f.verdict)] for f in findings]
    total = Counter(levels)
    left = sum(max(0, n - PER_LEVEL) for n in total.values())
    room = {level: PER_LEVEL - (level == "notice" and left > 0) for level in COMMANDS.values()}
    shown: Counter = Counter()
    lines = []
    for finding, level in zip(findings, levels):
        if shown[level] < room[level]:
            shown[level] += 1
            lines.append(_annotation(finding, level, report))
    skipped = total - shown
    if skipped:
        counts = ", ".join(f"{n} {level}{'s' * (n != 1)}" for level, n in skipped.items())
        text = (f"{sum(skipped.values())} more findings not annotated ({counts}): GitHub shows {PER_LEVEL} "
                "annotations of each level per step — see the full report (-f json, or report.html)")
        lines.append(workflow_command("notice", text, title="opscan: more findings"))
    return "\n".join(lines) + "\n"


def _annotation(finding: Finding, level: str, report: Report) -> str:
    ops, verdict = finding.ops, finding.verdict.value
    if ops:
        title = f"opscan: {verdict} on MPS: {ops[0]}" + (f" (+{len(ops) - 1} ops)" if len(ops) > 1 else "")
    else:  # a line of code no row holds (device code)
        title = f"opscan: {verdict} on a Mac: {finding.summary() or finding.rule}"
    if not located(finding.site):
        return workflow_command(level, message(finding, report), title=title)
    return workflow_command(level, message(finding, report), file=finding.site["file"], line=finding.site["line"],
                            title=title)
