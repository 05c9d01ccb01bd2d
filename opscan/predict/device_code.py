"""Predict stage: the user's code that picks a device, judged for the predicted-for release — one finding per
(rule, line of the user's code).

The trace records where the user's code asked something of a device while the target was built and its step ran
(trace/device_calls.py DeviceCall); the knowledge base says what a Mac does with it in each release
(knowledge/device_code.yaml). A `DeviceFinding` joins them: the rule, the user's line, what was asked, what a Mac
does (`effect`, `text`, `source`), the MPS spelling (`fix`), and the verdict it stands for:
- `raises`: `error` — the step as written raises on a Mac at that line;
- `cpu`: `cpu_fallback` — it runs, on the CPU: the line picks the CPU on a Mac, so nothing runs on MPS;
- `warns`, `ignored`, `answers`: no verdict — what a Mac does there, and the MPS spelling, for the record.
None of them decides the lane: the rows judge the step as it runs once the line is fixed (a one-line fix must not
send anyone to a Linux GPU); report/device_code.py puts a `placement` reason naming the line and the fix on the lane.
These are bugs of the user's code: no ISSUE.md or upstream repro is written for them. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscan.knowledge.device_code import EFFECTS, behaviour
from opscan.verdict import Verdict

_VERDICTS = {"raises": Verdict.ERROR, "cpu": Verdict.CPU_FALLBACK}


@dataclass(frozen=True)
class DeviceFinding:
    """One rule at one line of the user's code, judged for one release (see the module docstring)."""

    rule: str
    file: str | None  # the user's file, as recorded (absolute); None: a library's line only (`via`)
    line: int | None
    function: str | None
    via: tuple[str, int, str] | None
    phase: str  # "build" (import, factory, example inputs) or "step"
    asked: str  # as written: "torch.cuda.synchronize()", ".cuda()", "device='cuda'"
    calls: int
    effect: str
    text: str
    fix: str
    source: str
    releases: str  # the release range `text` holds for
    confidence: str = "source"

    @property
    def verdict(self) -> Verdict | None:
        """error for `raises`, cpu_fallback for `cpu`, else None."""
        return _VERDICTS.get(self.effect)

    def to_dict(self, relative=lambda path: path) -> dict[str, Any]:
        """JSON form; `relative(path)` writes the user's file relative to the project folder."""
        return {"rule": self.rule, "verdict": self.verdict.value if self.verdict else None, "effect": self.effect,
                "file": relative(self.file) if self.file else None, "line": self.line, "function": self.function,
                "via": {"file": self.via[0], "line": self.via[1], "function": self.via[2]} if self.via else None,
                "phase": self.phase, "asked": self.asked, "calls": self.calls, "text": self.text, "fix": self.fix,
                "source": self.source, "releases": self.releases, "confidence": self.confidence}


def device_findings(calls, release: str) -> tuple[DeviceFinding, ...]:
    """The findings of `calls` (DeviceCall records, build then step) for `release`, most severe first, then in the
    order they ran; calls of one rule at one line are merged. A rule the knowledge base lacks is skipped."""
    merged: dict[tuple, DeviceFinding] = {}
    for call in calls:
        known = behaviour(call.rule, release)
        if known is None:
            continue
        site = call.site
        key = (call.rule, call.asked, site)
        if key in merged:
            merged[key] = _more(merged[key], call.calls)
            continue
        merged[key] = DeviceFinding(
            call.rule, site.file if site else None, site.line if site else None, site.function if site else None,
            site.via if site else None, call.phase, call.asked, call.calls, known.effect, known.text, known.fix,
            known.source, str(known.releases), known.confidence)
    found = list(merged.values())
    return tuple(sorted(found, key=lambda f: EFFECTS.index(f.effect)))


def _more(finding: DeviceFinding, calls: int) -> DeviceFinding:
    from dataclasses import replace

    return replace(finding, calls=finding.calls + calls)
