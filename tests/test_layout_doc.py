"""docs/layout.md describes every module: each Python module of opscan/ (by package), op_probes/, examples/,
tools/ and bench/ (scripts and data files too) is named in its folder's part of the layout's tree, and every module
the tree names exists (a module renamed or removed leaves no stale line)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYOUT = REPO / "docs" / "layout.md"
_FILE = re.compile(r"(?<![\w/.-])([A-Za-z_][\w-]*\.(?:py|sh|yaml|txt))\b")
_TOP = re.compile(r"^([a-z_]+/)\s")  # opscan/, op_probes/, examples/, tools/, bench/
_SUB = re.compile(r"^  ([a-z_]+/)\s")  # a package of opscan/
_ROOT = re.compile(r"^  [a-z_]+\.py\b")  # a line of opscan/'s own modules


def _sections() -> dict[str, set[str]]:
    """folder ("opscan", "opscan/trace", "tools", ...) -> the file names its part of the tree names."""
    text = LAYOUT.read_text(encoding="utf-8")
    block = text.split("```\n", 2)[1]
    sections: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        if m := _TOP.match(line):
            current = m.group(1).rstrip("/")
        elif m := _SUB.match(line):
            current = f"opscan/{m.group(1).rstrip('/')}"
        elif _ROOT.match(line):
            current = "opscan"
        if current is not None:
            sections.setdefault(current, set()).update(_FILE.findall(line))
    return sections


def _tree() -> dict[str, set[str]]:
    """folder -> the files the layout must name: modules (not __init__.py), and tools/bench scripts and data."""
    out: dict[str, set[str]] = {}
    for folder in ("opscan", *(f"opscan/{p.name}" for p in (REPO / "opscan").iterdir()
                               if p.is_dir() and (p / "__init__.py").exists()), "op_probes", "examples"):
        out[folder] = {p.name for p in (REPO / folder).glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    for folder in ("tools", "bench"):
        out[folder] = {p.name for p in (REPO / folder).iterdir() if p.suffix in (".py", ".sh", ".yaml")}
    return out


def test_every_module_is_in_its_folder_s_part_of_the_layout():
    sections, tree = _sections(), _tree()
    missing = {folder: sorted(files - sections.get(folder, set())) for folder, files in tree.items()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_every_module_the_layout_names_exists():
    """A module named in a folder's part is that folder's, or one it refers to elsewhere in the tree (`scan.py's
    stages`): never a module that is gone."""
    everywhere = {p.name for folder in ("opscan", "op_probes", "examples", "tools", "bench")
                  for p in (REPO / folder).rglob("*.py")}
    stale = {folder: sorted(n for n in named if n.endswith(".py") and n not in everywhere)
             for folder, named in _sections().items()}
    assert {k: v for k, v in stale.items() if v} == {}
