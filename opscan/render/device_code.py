"""Render stage: the report's `device_code` entries no finding holds, as console lines (report/device_code.py
builds the section; those with a verdict — `raises`, `cpu` — are findings, listed with the others).

    Code that picks a device, no finding: what a Mac does there (torch 2.14.1; ...):
      1. train.py:9 in <module> · torch.backends.cudnn.benchmark = ... · ignored
         cuDNN does not exist on a Mac: ...
         MPS: ...

Pure: a function of the Report; text escaped by the caller's `escape` (console.py).
"""

from __future__ import annotations

SHOWN_FINDINGS = 12  # findings listed; the rest are counted (report.json has them all)


def device_code_lines(report) -> list[str]:
    """The lines of the section's entries without a verdict ([] when there are none)."""
    section = report.device_code or {}
    findings = [f for f in section.get("findings") or [] if not f.get("verdict")]
    if not findings:
        return []
    release = report.assumptions.get("torch_release")
    lines = ["", f"Code that picks a device, no finding: what a Mac does there (torch {release}; each one's source: "
                 "report.json device_code):"]  # a line of its own: console.py escapes each line, a "\n" too
    for number, f in enumerate(findings[:SHOWN_FINDINGS], 1):
        where = f"{f['file']}:{f['line']} in {f['function']}" if f.get("file") else _via(f)
        times = f" ×{f['calls']}" if f.get("calls", 1) > 1 else ""
        lines.append(f"  {number}. {where} · {f['asked']}{times} · {f['effect']}"
                     f"{' (reported, not read from the wheels)' if f.get('confidence') == 'reported' else ''}")
        lines.append(f"     {f['text']}")
        lines.append(f"     MPS: {f['fix']}")
    if len(findings) > SHOWN_FINDINGS:
        lines.append(f"  … and {len(findings) - SHOWN_FINDINGS} more (see report.json, device_code)")
    return lines


def _via(finding) -> str:
    via = finding.get("via") or {}
    return f"via {via.get('file')}:{via.get('line')} in {via.get('function')}" if via else "(no line of the user's)"
