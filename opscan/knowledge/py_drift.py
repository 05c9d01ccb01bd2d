"""Knowledge stage: how torch's Python functions differ between releases (py_drift.txt) and the review of the
differences that dispatch the same ops (py_review.yaml).

py_drift.txt (written by tools/build_py_drift.py from the macOS arm64 wheels of releases/index.txt): a
`releases R1 R2 ...` line (every covered release, oldest first), then one row per covered unit (pynorm.py):

    torch/optim/adam.py:_single_tensor_adam 2.0.0=1f0c9a2b3d 2.1.0=8e7d6c5b4a 2.7.0=e9b3c75201

each `RELEASE=HASH` holding from that release up to the next field's release (`-`: the unit does not exist
there). A unit's hash in the installed torch is computed from its own files (`installed_hash`), so a trace made
with any release compares what it ran with what release R has.

py_review.yaml (hand-kept): per unit, sets of hashes whose versions dispatch the same ops for the calls a step
makes (`same_ops`), each with the reason and where it was checked. A hash no entry lists is unreviewed: a scan
for a release that has it says so. No torch import (the installed files are found without importing torch).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from opscan.knowledge.pynorm import unit_hashes
from opscan.knowledge.facts import HERE
from opscan.knowledge.schema import entry_values
from opscan.knowledge.table_text import read_shipped

PY_DRIFT_PATH = os.path.join(HERE, "py_drift.txt")
PY_REVIEW_PATH = os.path.join(HERE, "py_review.yaml")
ABSENT = "-"
DRIFT_SOURCE = "opscan/knowledge/py_drift.txt (normalized function bodies of each release's macOS arm64 wheel)"


@dataclass(frozen=True)
class PyDrift:
    """The table: covered releases (oldest first) and, per unit, its (first release index, hash or None) runs."""

    releases: tuple[str, ...]
    rows: Mapping[str, tuple[tuple[int, str | None], ...]]

    def covers(self, unit: str, release: str) -> bool:
        """Whether the table knows `unit`'s code in `release`."""
        return unit in self.rows and release in self.releases

    def hash_in(self, unit: str, release: str) -> str | None:
        """The unit's hash in `release` (None: the unit does not exist there); KeyError when not covered."""
        index = self.releases.index(release)
        found = None
        for first, digest in self.rows[unit]:
            if first > index:
                break
            found = digest
        return found

    def distinct(self, unit: str) -> tuple[str, ...]:
        """Every hash the unit has in some covered release, oldest first."""
        return tuple(dict.fromkeys(d for _, d in self.rows[unit] if d is not None))

    def releases_with(self, unit: str, digest: str | None) -> tuple[str, ...]:
        """The covered releases in which the unit has `digest` (None: where it is absent)."""
        return tuple(r for r in self.releases if self.hash_in(unit, r) == digest)


def parse_py_drift(text: str) -> PyDrift:
    """Parse py_drift.txt; ValueError on a malformed line."""
    releases: tuple[str, ...] = ()
    rows: dict[str, tuple] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        fields = line.split(" ")
        if fields[0] == "releases":
            releases = tuple(fields[1:])
            continue
        runs = []
        for field in fields[1:]:
            release, _, digest = field.partition("=")
            if release not in releases or not digest:
                raise ValueError(f"py_drift.txt line {number}: bad field {field!r}")
            runs.append((releases.index(release), None if digest == ABSENT else digest))
        if not runs or runs[0][0] != 0 or fields[0] in rows:
            raise ValueError(f"py_drift.txt line {number}: a row must start at {releases[:1]} and be unique")
        rows[fields[0]] = tuple(runs)
    return PyDrift(releases, MappingProxyType(rows))


def format_py_drift(releases: list[str], hashes: Mapping[str, Mapping[str, str | None]], header: str) -> str:
    """The text of py_drift.txt: `hashes` is unit -> release -> hash (None or missing: absent)."""
    lines = [header.rstrip("\n"), "releases " + " ".join(releases)]
    for unit in sorted(hashes):
        fields, last = [], object()
        for release in releases:
            digest = hashes[unit].get(release) or ABSENT
            if digest != last:
                fields.append(f"{release}={digest}")
                last = digest
        lines.append(f"{unit} {' '.join(fields)}")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=2)
def load_py_drift(path: str = PY_DRIFT_PATH) -> PyDrift | None:
    """The shipped table (cached); None when the file is absent."""
    return read_shipped(path, parse_py_drift)


@dataclass(frozen=True)
class SameOps:
    """Versions of one unit that dispatch the same ops for the calls a step makes."""

    unit: str
    versions: frozenset[str]
    reason: str
    source: str


def parse_py_review(raw: dict) -> Mapping[str, tuple[SameOps, ...]]:
    """unit -> its same-ops classes, from a loaded py_review.yaml; ValueError on a bad entry."""
    if raw.get("schema") != 1:
        raise ValueError(f"py_review.yaml: unsupported schema {raw.get('schema')!r}")
    table: dict[str, tuple] = {}
    for entry in raw.get("same_ops") or []:
        found = SameOps(**entry_values(SameOps, entry, "py_review.yaml", "entry", unit=str, reason=str, source=str,
                                       versions=lambda v: frozenset(map(str, v))))
        missing = [k for k in ("unit", "versions", "reason") if not entry[k]]
        if missing:
            raise ValueError(f"py_review.yaml: entry {entry!r} lacks {missing}")
        table[found.unit] = table.get(found.unit, ()) + (found,)
    return MappingProxyType(table)


@functools.lru_cache(maxsize=2)
def load_py_review(path: str = PY_REVIEW_PATH) -> Mapping[str, tuple[SameOps, ...]]:
    """The shipped review (cached); empty when the file is absent."""
    if not os.path.isfile(path):
        return MappingProxyType({})
    with open(path, encoding="utf-8") as fh:
        return parse_py_review(yaml.safe_load(fh) or {})


def same_ops(unit: str, a: str | None, b: str | None) -> SameOps | None:
    """The review entry that puts versions `a` and `b` of `unit` (None: absent) in one class, or None."""
    a, b = a or ABSENT, b or ABSENT
    return next((e for e in load_py_review().get(unit, ()) if a in e.versions and b in e.versions), None)


@functools.lru_cache(maxsize=None)
def _torch_dir() -> str | None:
    spec = importlib.util.find_spec("torch")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=64)
def _installed_file(rel: str) -> Mapping[str, str]:
    base = _torch_dir()
    path = os.path.join(os.path.dirname(base), *rel.split("/")) if base else ""
    if not os.path.isfile(path):
        return MappingProxyType({})
    with open(path, encoding="utf-8", errors="replace") as fh:
        return MappingProxyType(unit_hashes(fh.read()))


def installed_hash(unit: str) -> str | None:
    """The unit's hash in the installed torch's own files (None: not found there)."""
    rel, _, qualname = unit.partition(":")
    return _installed_file(rel).get(qualname)
