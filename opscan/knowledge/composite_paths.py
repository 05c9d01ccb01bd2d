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
from opscan.opkey import ReleaseRange

PATHS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composite_paths.yaml")


@dataclass(frozen=True)
class Path:
    """One branch of a composite's body."""

    calls: tuple[str, ...]  # yaml spellings of the ops it always reaches
    when: str | None  # the branch condition over the schema's argument names, or None (always)
    code: ast.Expression | None
    result: str | None  # a sparse layout the path returns, or None


@dataclass(frozen=True)
class CompositePaths:
    """The paths of one composite in a release range."""

    op: str
    releases: ReleaseRange
    args: tuple[str, ...]
    paths: tuple[Path, ...]
    source: str


def _path(raw: dict) -> Path:
    when = raw.get("when")
    return Path(tuple(raw["calls"]), when, compile_when(when) if when else None, raw.get("result"))


@functools.lru_cache(maxsize=2)
def load_paths(path: str = PATHS_FILE) -> tuple[CompositePaths, ...]:
    """The shipped entries (ValueError or KeyError on a malformed one)."""
    return _entries(path, "paths")


@functools.lru_cache(maxsize=2)
def load_sparse_paths(path: str = PATHS_FILE) -> tuple[CompositePaths, ...]:
    """The shipped `sparse_paths` entries: one path each, the ops its body reaches for a sparse COO input."""
    return _entries(path, "sparse_paths")


def sparse_paths_for(op: str, release: str) -> CompositePaths | None:
    """The sparse-input branch of overload `op` (yaml spelling) covering `release`, or None."""
    return next((e for e in load_sparse_paths() if e.op == op and e.releases.covers(release)), None)


def _entries(path: str, section: str) -> tuple[CompositePaths, ...]:
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    out = []
    for item in raw.get(section, ()):
        out.append(CompositePaths(item["op"], ReleaseRange.parse(item["releases"]), tuple(item.get("args", ())),
                                  tuple(_path(p) for p in item["paths"]), " ".join(str(item["source"]).split())))
    return tuple(out)


def paths_for(op: str, release: str) -> CompositePaths | None:
    """The entry for overload `op` (yaml spelling) covering `release`, or None."""
    return next((e for e in load_paths() if e.op == op and e.releases.covers(release)), None)
