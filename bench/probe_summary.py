"""Summarise a measured report.json: probes, calls, outcomes, rows not native on the probe device (with
PyTorch's text), and the checks measured mode promises (every row measured, nothing unknown).

    python bench/probe_summary.py reports/cnn/report.json [LABEL]

Exit status 1 when a row has no measurement or a probe could not be built.
"""

from __future__ import annotations

import json
import sys


def summarise(doc: dict, label: str) -> list[str]:
    """The summary lines; the last one is `ok` or `FAIL: ...`."""
    m = doc["measurement"]
    env = m["environment"]["off"] or {}
    lines = [f"== {label}: measured on {m['device']} ({'stands for MPS' if m['stands_for_mps'] else 'not MPS'}); "
             f"torch {env.get('torch')} {env.get('gpu') or ''} tf32={env.get('tf32', '-')}",
             f"   {m['probes']} probes for {m['calls']} calls · outcomes {m['outcomes']} · shapes {m['shapes']}"]
    for row in doc["ops"]:
        block = row.get("measured") or {}
        if block.get("verdict") != "native":
            off = block.get("off") or {}
            lines.append(f"   {row['op']}.{row['overload']} {row['dtypes']}: {block.get('verdict')} — "
                         f"{off.get('message') or block.get('text', '')[:200]}")
    unmeasured = [r["op"] for r in doc["ops"] if not r.get("measured")]
    problems = (["rows without a measurement: " + ", ".join(unmeasured[:5])] if unmeasured else []) + \
               ([f"{m['outcomes']['unknown']} probes unknown"] if m["outcomes"].get("unknown") else [])
    lines.append("   FAIL: " + "; ".join(problems) if problems else "   ok: every row measured, nothing unknown")
    return lines


def main() -> int:
    """Print the summary of one report."""
    doc = json.load(open(sys.argv[1], encoding="utf-8"))
    lines = summarise(doc, sys.argv[2] if len(sys.argv) > 2 else sys.argv[1])
    print("\n".join(lines))
    return 1 if "FAIL" in lines[-1] else 0


if __name__ == "__main__":
    sys.exit(main())
