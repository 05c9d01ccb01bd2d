"""Report stage: a row decided by a known silent-correctness bug (predict/silent.py) — the entry, the calls that
meet its condition (the row's evidence lists them), and the remedy naming the user's modules where they are.

`with_silent(use, worst, group)` returns (use, classification) for collect_rows: unchanged unless the row's worst
verdict came from a `silent-bug-<id>` rule. Pure data, no torch.
"""

from __future__ import annotations

from dataclasses import replace

from opscan.predict.silent import entry_of
from opscan.verdict import Classification

SHOWN_CALLS = 8  # calls listed in a row's `silent.calls` (the rest are counted)


def with_silent(use, worst: Classification, group) -> tuple:
    """(use with its `silent` section, classification with the modules in its remedy) for a silent-bug row."""
    bug = entry_of(worst.evidence.rule)
    if bug is None:
        return use, worst
    calls = [c for c, found in group if found.evidence.rule == worst.evidence.rule]
    modules = list(dict.fromkeys(c.module or "(model)" for c in calls))
    section = {
        "id": bug.id, "issues": list(bug.issues), "fix_pr": bug.fix_pr, "affected": [bug.first, f"{bug.last}.x"],
        "fixed_in": bug.fixed, "macos": bug.macos_text, "chip": list(bug.chip) or None,
        "confidence": bug.confidence, "workaround": bug.workaround, "modules": modules,
        "meeting": len(calls), "calls": [_call(c) for c in calls[:SHOWN_CALLS]],
    }
    remedy = f"in {', '.join(modules)}: {worst.remedy}"
    return replace(use, silent=section), replace(worst, remedy=remedy)


def _call(call) -> dict:
    """One call meeting the condition: where it is in the step and its tensors' layout."""
    return {"index": call.index, "module": call.module or "(model)", "phase": call.phase,
            "inputs": [{"dtype": t.dtype, "shape": list(t.shape), "stride": list(t.stride), "offset": t.offset,
                        "device": "cpu" if t.host else "mps"} for t in call.inputs]}
