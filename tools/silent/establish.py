"""The release calendar (tools/silent/releases.yaml) and the rules that establish a silent-bug entry's releases
from it, applied to every entry of opscan/knowledge/silent_bugs.yaml:

- the fixing release is the first x.y.0 whose branch was cut after the fixing PR merged (`fix_merged`), "open"
  when no covered series was cut after it, unless the entry's `established` names a cherry-pick;
- the release current on a day is the newest x.y.0 released on or before it (a report's `reported` day, when the
  reporter's version is not known).

    python tools/silent/establish.py            # one line per entry: its dates and what the rules give
    python tools/silent/establish.py --check    # exit 1 naming each entry whose fixed_in disagrees

tests/test_silent_bugs.py runs --check. No torch import.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CALENDAR = Path(__file__).resolve().parent / "releases.yaml"


def calendar(path: Path = CALENDAR) -> list[tuple[str, dt.date, dt.date]]:
    """[(series, cut, released)] in release order."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))["series"]
    rows = [(str(s), _day(v["cut"]), _day(v["released"])) for s, v in data.items()]
    return sorted(rows, key=lambda r: tuple(int(p) for p in r[0].split(".")))


def _day(value) -> dt.date:
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))


def fixing_release(merged, path: Path = CALENDAR) -> str:
    """The first x.y.0 whose branch was cut after `merged` (a date), or "open" past the last covered cut."""
    day = _day(merged)
    return next((f"{series}.0" for series, cut, _ in calendar(path) if cut > day), "open")


def current_release(day, path: Path = CALENDAR) -> str | None:
    """The newest x.y.0 released on or before `day`; None before 2.0.0."""
    released = [f"{series}.0" for series, _, rel in calendar(path) if rel <= _day(day)]
    return released[-1] if released else None


def disagreements(bugs, path: Path = CALENDAR) -> list[str]:
    """One line per entry whose fixed_in is not what its fix_merged day gives (cherry-picks named excepted)."""
    out = []
    for bug in bugs:
        if bug.fix_merged is None:
            continue
        expected = fixing_release(bug.fix_merged, path)
        if bug.fixed != expected and "cherry-pick" not in bug.established:
            out.append(f"{bug.id}: fix merged {bug.fix_merged} -> {expected}, but fixed_in is {bug.fixed}")
    return out


def main(argv=None) -> int:
    from opscan.knowledge.silent_bugs import load_bugs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when an entry's fixed_in disagrees")
    args = parser.parse_args(argv)
    bugs = load_bugs()
    if args.check:
        problems = disagreements(bugs)
        for line in problems:
            print(line)
        return 1 if problems else 0
    for bug in bugs:
        rule = fixing_release(bug.fix_merged) if bug.fix_merged else "-"
        print(f"{bug.id}\treported {bug.reported} (current {current_release(bug.reported)})\t"
              f"fix merged {bug.fix_merged or '-'} -> {rule}\taffected {bug.releases}, fixed {bug.fixed}"
              f"\t{bug.confidence}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
