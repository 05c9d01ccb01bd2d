"""Knowledge base: the plain-text tables the tools write (opinfo_map.txt, composites.txt): a `torch RELEASE GIT`
header line, '#' comments, then one space-separated row per line; and the shipped-file loader they share."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def header_and_rows(text: str) -> tuple[str, str, list[tuple[int, str, list[str]]]]:
    """(release, git version, [(line number, line, fields)]) of a table's text; blank and '#' lines skipped."""
    release = git = ""
    rows = []
    for number, line, fields in _lines(text):
        if fields[0] == "torch":
            release, git = fields[1], fields[2]
        else:
            rows.append((number, line, fields))
    return release, git, rows


def _lines(text: str) -> Iterator[tuple[int, str, list[str]]]:
    for number, line in enumerate(text.splitlines(), 1):
        if line and not line.startswith("#"):
            yield number, line, line.split(" ")


def read_shipped(path: str, parse: Callable[[str], T]) -> T | None:
    """`parse` of the file at `path` (None when the file is absent: a checkout without the generated table)."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return parse(fh.read())
