"""Render stage: the report's `device_code` section as console lines (report/device_code.py builds it).

    Code that picks a device, as a Mac runs it (torch 2.14.1):
      1. train.py:4 in <module> · torch.cuda.is_available() · cpu
         torch.cuda.is_available() is False on a Mac, so this picks the CPU: ...
         MPS: "cuda" if torch.cuda.is_available() else "mps" if ...

Pure: a function of the Report; text escaped by the caller's `escape` (console.py).
"""

from __future__ import annotations

SHOWN_FINDINGS = 12  # findings listed; the rest are counted (report.json has them all)


def device_code_lines(report) -> list[str]:
    """The section's lines ([] without findings)."""
    section = report.device_code or {}
    findings = section.get("findings") or []
    if not findings:
        return []
    release = report.assumptions.get("torch_release")
    lines = [f"\nCode that picks a device, as a Mac runs it (torch {release}; each one's source: report.json "
             "device_code):"]
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
