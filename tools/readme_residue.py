"""Check that splitting the README into docs/ lost nothing: every non-empty line of an old README must appear in
README.md or in some docs/**/*.md today.

    git show e846139:README.md > /tmp/README.old.md
    python tools/readme_residue.py /tmp/README.old.md

A line counts as found when it is there verbatim; else when it is there once links are read as their text and
double quotes dropped (a section named "Memory" became the link [Memory](memory.md)): a *link line*; else, for a
heading, when a heading with the same text is there at any level: a *moved heading*. What is left is the residue,
printed in full with its line number. Exit status 0 when the residue is empty, 1 otherwise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def normal(line: str) -> str:
    line = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^()\s]*\)", r"\1", line)
    return " ".join(line.replace('"', "").split())


def heading(line: str) -> str | None:
    m = re.match(r"#{1,6}\s+(.*\S)", line)
    return normal(m.group(1)) if m else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    old = Path(argv[0]).read_text(encoding="utf-8").splitlines()
    new = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    lines = [line for path in new for line in path.read_text(encoding="utf-8").splitlines()]
    verbatim = set(lines)
    normalised = {normal(line) for line in lines}
    headings = {h for line in lines if (h := heading(line))}
    counts = {"verbatim": 0, "link line": 0, "moved heading": 0}
    residue = []
    for number, line in enumerate(old, 1):
        if not line.strip():
            continue
        if line in verbatim:
            counts["verbatim"] += 1
        elif normal(line) in normalised:
            counts["link line"] += 1
        elif heading(line) and heading(line) in headings:
            counts["moved heading"] += 1
        else:
            residue.append((number, line))
    total = sum(counts.values()) + len(residue)
    print(f"{total} non-empty lines: " + ", ".join(f"{n} {k}" for k, n in counts.items())
          + f", {len(residue)} residue")
    for number, line in residue:
        print(f"  {number}: {line}")
    return 1 if residue else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
