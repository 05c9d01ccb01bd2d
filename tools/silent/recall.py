"""Recall of the silent-bug knowledge base, measured: would the entries known before a day D have predicted the bugs
reported after it?

    python tools/silent/recall.py 2026-01-01           # the table, as docs/silent-bugs.md quotes it
    python tools/silent/recall.py 2026-01-01 --write   # also store it in tools/silent/recall.json for the doc

The entries of opscan/knowledge/silent_bugs.yaml reported before D form the base; every entry reported on or after
D is a held-out bug, and its reporter's repro (tests/targets/silent_repros.py: `repro_<id>`, scanned at the release,
macOS and chip of its REPROS row) is scanned against that base alone. A held-out bug is predicted when the scan
reports a row decided by any entry of the base (a `silent-bug-*` mismatch), or a note of one (an entry that meets
the call on another chip or macOS). Slow: one trace per held-out repro (about 30 s for 30).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TARGETS = ROOT / "tests" / "targets" / "silent_repros.py"
RESULT = Path(__file__).resolve().parent / "recall.json"


def repro_table() -> dict:
    """REPROS of the repro targets file: entry id -> Repro."""
    spec = importlib.util.spec_from_file_location("silent_repros_table", TARGETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.REPROS


def split(bugs, day: dt.date) -> tuple[list, list]:
    """(entries reported before `day`, entries reported on or after it)."""
    before = [b for b in bugs if dt.date.fromisoformat(b.reported) < day]
    return before, [b for b in bugs if b not in before]


def decided_by(bug_id: str, repro, base) -> tuple[list[str], list[str]]:
    """([entries of `base` deciding a row of the repro's scan], [entries named in a row's note])."""
    from opscan.scan import ScanOptions, prepare, scan

    options = ScanOptions(f"{TARGETS}:repro_{bug_id}", torch_version=repro.release, macos=repro.macos,
                          chip=repro.chip, inference=not repro.train, fake=repro.fake, memory=False)
    prepared = prepare(options)
    ids = {b.id for b in base}
    silent = {op: tuple(b for b in found if b.id in ids) for op, found in prepared.kb.silent.items()}
    kb = replace(prepared.kb, silent={op: found for op, found in silent.items() if found})
    rows = scan(options, prepared=replace(prepared, kb=kb)).rows
    decided = sorted({r.evidence.rule.removeprefix("silent-bug-") for r in rows
                      if r.evidence.rule.startswith("silent-bug-")})
    noted = sorted({i for r in rows for i in ids if f"silent bug silent-bug-{i} " in r.evidence.text})
    return decided, noted


def measure(day: dt.date) -> dict:
    """The recall at `day`: the base, every held-out bug and what (if anything) predicted it."""
    from opscan.knowledge.silent_bugs import load_bugs

    before, after = split(load_bugs(), day)
    table = repro_table()
    held = []
    for bug in sorted(after, key=lambda b: b.reported):
        decided, noted = decided_by(bug.id, table[bug.id], before)
        held.append({"id": bug.id, "reported": bug.reported, "title": bug.title, "predicted_by": decided,
                     "noted_by": noted})
    return {"day": day.isoformat(), "base": len(before), "held_out": len(held),
            "predicted": sum(bool(h["predicted_by"]) for h in held),
            "noted_only": sum(bool(h["noted_by"]) and not h["predicted_by"] for h in held), "bugs": held}


def render(result: dict) -> str:
    """The Markdown table docs/silent-bugs.md quotes."""
    lines = [f"D = {result['day']}: {result['base']} entries reported before D; {result['held_out']} reported on "
             f"or after it, of which {result['predicted']} are predicted by the earlier entries "
             f"({result['noted_only']} more only as a note).", "",
             "| held-out bug | reported | predicted by |", "|---|---|---|"]
    for h in result["bugs"]:
        by = ", ".join(map(_ref, h["predicted_by"])) or (
            "note: " + ", ".join(map(_ref, h["noted_by"])) if h["noted_by"] else "—")
        lines.append(f"| {_ref(h['id'])} {h['title']} | {h['reported']} | {by} |")
    return "\n".join(lines) + "\n"


def _ref(entry_id: str) -> str:
    """#<issue> for an issue number, else the entry's id (a regression test's name)."""
    return f"#{entry_id}" if entry_id.isdigit() else entry_id


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("day", type=dt.date.fromisoformat, help="the cutoff day D, YYYY-MM-DD")
    parser.add_argument("--write", action="store_true", help=f"also write the result to {RESULT.name}")
    args = parser.parse_args(argv)
    result = measure(args.day)
    if args.write:
        RESULT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(render(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
