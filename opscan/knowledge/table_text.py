"""Knowledge base: the plain-text tables the tools write (opinfo_map.txt, composites.txt): a `torch RELEASE GIT`
header line, '#' comments, then one space-separated row per line; the shipped-file loader they share; and the
release runs of the per-release tables (composite_callees.txt, signatures.txt): `2.0.0..2.2.2,2.5.0`, runs of
consecutive covered releases."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from types import MappingProxyType
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


def format_by_release(releases: list[str], per_release, row, header: str) -> str:
    """A per-release table's text: `header` (comment lines, each starting with '#'), the `releases` line, then one
    line per op and group of releases with equal values: row(op, runs, value), runs as `2.0.0..2.2.2,2.5.0`."""
    lines = [header.rstrip("\n"), "releases " + " ".join(releases)]
    for op in sorted({op for table in per_release.values() for op in table}):
        groups: dict = {}
        for release in releases:
            found = per_release[release].get(op)
            if found is not None:
                groups.setdefault(found, []).append(release)
        lines.extend(row(op, _runs(members, releases), value) for value, members in groups.items())
    return "\n".join(lines) + "\n"


def parse_by_release(text: str, name: str, runs_at: int, value):
    """(releases, release -> op -> value) of a per-release table's text: `value(fields, where)` reads a row's
    value (ValueError on a malformed one), its field `runs_at` the releases it holds for."""
    releases: tuple[str, ...] = ()
    tables: dict[str, dict] = {}
    for number, line, fields in _lines(text):
        if fields[0] == "releases":
            releases = tuple(fields[1:])
            tables = {r: {} for r in releases}
            continue
        where = f"{name} line {number}"
        if len(fields) <= runs_at + 1 or not releases:
            raise ValueError(f"{where}: malformed: {line!r}")
        found = value(fields, where)
        for release in _expand(fields[runs_at], releases, where):
            if fields[0] in tables[release]:
                raise ValueError(f"{where}: {fields[0]} repeated for {release}")
            tables[release][fields[0]] = found
    return releases, MappingProxyType({r: MappingProxyType(t) for r, t in tables.items()})


def _runs(members: list[str], releases: list[str]) -> str:
    """`2.0.0..2.2.2,2.5.0`: `members` (covered releases, in order) as runs of consecutive covered releases."""
    position = {r: i for i, r in enumerate(releases)}
    runs: list[list[str]] = []
    for r in members:
        if runs and position[runs[-1][-1]] + 1 == position[r]:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def _expand(spec: str, releases: tuple[str, ...], where: str) -> list[str]:
    """The covered releases `spec` (_runs' text) names; ValueError naming `where` on one not covered."""
    out = []
    for part in spec.split(","):
        first, _, last = part.partition("..")
        if first not in releases or (last and last not in releases):
            raise ValueError(f"{where}: unknown release in {spec!r}")
        out.extend(releases[releases.index(first):releases.index(last or first) + 1])
    return out
