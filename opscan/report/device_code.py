"""Report stage: the report's `device_code` section and its reasons on the lane.

The section lists the DeviceFindings (predict/device_code.py) of the user's code that picks a device, with the file
relative to the project folder:

    {"findings": [{"rule": "device-pick-cpu", "verdict": "cpu_fallback", "effect": "cpu", "file": "train.py",
                   "line": 4, "function": "<module>", "asked": "torch.cuda.is_available()", "text": "...",
                   "fix": "...", "source": "...", "releases": "2.6.0..2.14.1", "code": "device = ...", ...}],
     "source": "predicted"}

(`code`: the line's source text, null when it cannot be read). The findings with a verdict — `raises` (error) and
`cpu` (cpu_fallback) — are also findings of the report (report/findings.py, with no rows: the step's ops are judged
as they run once the line is fixed); the section is their full record, with those that only warn, are ignored or
answer differently on a Mac.

The lane stays the one the rows decide (the step as it runs once the line is fixed), and each finding that changes
what a Mac runs — `raises` (the step as written raises there) and `cpu` (it runs on the CPU) — adds a `placement`
reason before the others, naming the line and the fix: a one-line bug of the user's code must not send anyone to
a Linux GPU, nor leave a silent mac-first for a step that runs on the CPU. Pure data, no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opscan.graph.lanes import Lane, Reason, ReasonKind
from opscan.report.where import source_line
from opscan.target.user_code import relative_to
from opscan.verdict import Source

LANE_EFFECTS = ("raises", "cpu")


def device_section(findings, project: str | None) -> dict[str, Any] | None:
    """The `device_code` section, or None without findings."""
    if not findings:
        return None
    return {"findings": [{**f.to_dict(lambda path: relative_to(path, project)), "code": source_line(f.file, f.line)}
                         for f in findings],
            "source": Source.PREDICTED.value}


def with_device_reasons(lane: Lane, findings, project: str | None) -> Lane:
    """`lane` with a `placement` reason first for each finding whose effect is in LANE_EFFECTS."""
    reasons = tuple(Reason(ReasonKind.PLACEMENT, reason_text(f, project)) for f in findings
                    if f.effect in LANE_EFFECTS)
    return replace(lane, why=(*reasons, *lane.why)) if reasons else lane


def reason_text(finding, project: str | None = None) -> str:
    """"train.py:4 runs the step on the CPU on a Mac, not MPS (...) — the lane is for the step once it picks mps:
    <fix>"; the part before the first ': ' reads on its own (the console's lane line shows it)."""
    where = short_where(finding, project)
    if finding.effect == "cpu":
        return (f"{where} runs the step on the CPU on a Mac, not on MPS ({finding.asked} is False there, so it picks "
                f"the CPU) — the lane is for the step once that line picks mps: {finding.fix}")
    return (f"{where} raises on a Mac as written ({finding.asked}) — the lane is for the step once that line is "
            f"fixed: {finding.fix}")


def short_where(finding, project: str | None = None) -> str:
    """"train.py:4" (the file relative to the project), "via lib.py:12" for a library's line, "(no line)"."""
    if finding.file:
        return f"{relative_to(finding.file, project)}:{finding.line}"
    if finding.via:
        return f"via {finding.via[0]}:{finding.via[1]}"
    return "(no line)"
