"""Knowledge stage: the possible paths of composites a trace cannot expand in an older release
(`composite_paths.yaml`: one entry per composite and release range, one path per branch of its C++ body).

`paths_for(op_yaml_name, release)` gives the entry that covers a release, or None. `sparse_paths_for` gives the
branch a composite's body takes for a sparse (COO) input (`sparse_paths`: the trace sees no callees there, and
predict/sparse.py judges each op of the branch with the same layout). No torch import.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass

import yaml

from opscan.knowledge.conditions import compile_when
from opscan.knowledge.schema import derived, entry_values
from opscan.opkey import ReleaseRange

PATHS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composite_paths.yaml")


@dataclass(frozen=True)
class Path:
    """One branch of a composite's body."""

    calls: tuple[str, ...]  # yaml spellings of the ops it always reaches
    when: str | None = None  # the branch condition over the schema's argument names, or None (always)
    code: ast.Expression | None = derived(default=None)
    result: str | None = None  # a sparse layout the path returns, or None


@dataclass(frozen=True)
class CompositePaths:
    """The paths of one composite in a release range."""

    op: str
    releases: ReleaseRange
    paths: tuple[Path, ...]
    source: str


@dataclass(frozen=True)
class PathsFile:
    """All of composite_paths.yaml: the composites' paths and their sparse-input branches."""

    paths: tuple[CompositePaths, ...]
    sparse_paths: tuple[CompositePaths, ...]


def _path(raw) -> Path:
    values = entry_values(Path, raw, "composite_paths.yaml", "path", calls=tuple)
    return Path(**values, code=compile_when(values["when"]) if values.get("when") else None)


def _entry(raw) -> CompositePaths:
    return CompositePaths(**entry_values(
        CompositePaths, raw, "composite_paths.yaml", "entry", releases=ReleaseRange.parse,
        paths=lambda paths: tuple(map(_path, paths)), source=lambda text: " ".join(str(text).split())))


@functools.lru_cache(maxsize=2)
def load_composite_paths(path: str = PATHS_FILE) -> PathsFile:
    """The shipped file, read once (ValueError on a malformed entry)."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    return PathsFile(*(tuple(map(_entry, raw.get(section, ()))) for section in ("paths", "sparse_paths")))


def sparse_paths_for(op: str, release: str) -> CompositePaths | None:
    """The sparse-input branch of overload `op` (yaml spelling) covering `release`, or None."""
    return next((e for e in load_composite_paths().sparse_paths if e.op == op and e.releases.covers(release)), None)


def paths_for(op: str, release: str) -> CompositePaths | None:
    """The entry for overload `op` (yaml spelling) covering `release`, or None."""
    return next((e for e in load_composite_paths().paths if e.op == op and e.releases.covers(release)), None)
