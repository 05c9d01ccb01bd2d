"""Summarise a measured report.json: probes, calls, outcomes, rows not native on the probe device (with
PyTorch's text), and the checks measured mode promises (every row measured, nothing unknown) and that measured and
predicted agree on what raises: a row measured `error` whose prediction is not `error` (a host tensor the placement
model missed, say) fails. Only error against not-error is compared, never the messages: a measurement on cuda is a
proxy for MPS, whose kernels word their refusals differently.

    python bench/probe_summary.py [--no-errors] reports/cnn/report.json [LABEL]

Exit status 1 when a row has no measurement, a probe could not be built, or a measured error was not predicted;
with --no-errors (a target that must run clean, as bench/cuda_probe_check.sh's examples) also when any row was
measured `error`, predicted or not.
"""

from __future__ import annotations

import json
import sys


def summarise(doc: dict, label: str, no_errors: bool = False) -> list[str]:
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
    unpredicted = [f"{r['op']}.{r['overload']} {r['dtypes']}" for r in doc["ops"] if _unpredicted_error(r)]
    problems = (["rows without a measurement: " + ", ".join(unmeasured[:5])] if unmeasured else []) + \
               ([f"{m['outcomes']['unknown']} probes unknown"] if m["outcomes"].get("unknown") else []) + \
               ([f"measured error, not predicted: {', '.join(unpredicted[:5])}"] if unpredicted else [])
    errors = [f"{r['op']}.{r['overload']} {r['dtypes']}" for r in doc["ops"]
              if (r.get("measured") or {}).get("verdict") == "error"]
    if no_errors and errors:
        problems.append(f"measured error on a target that must run clean: {', '.join(errors[:5])}")
    lines.append("   FAIL: " + "; ".join(problems) if problems else "   ok: every row measured, nothing unknown")
    return lines


def predicted_verdict(row: dict) -> str:
    """The row's predicted verdict: its own on cpu/cuda (they never stand for MPS), else the prediction it replaced."""
    return (row.get("predicted") or {}).get("verdict") or row["verdict"]


def _unpredicted_error(row: dict) -> bool:
    return (row.get("measured") or {}).get("verdict") == "error" and predicted_verdict(row) != "error"


def main() -> int:
    """Print the summary of one report."""
    args = [a for a in sys.argv[1:] if a != "--no-errors"]
    with open(args[0], encoding="utf-8") as fh:
        doc = json.load(fh)
    lines = summarise(doc, args[1] if len(args) > 1 else args[0], "--no-errors" in sys.argv[1:])
    print("\n".join(lines))
    return 1 if "FAIL" in lines[-1] else 0


if __name__ == "__main__":
    sys.exit(main())
