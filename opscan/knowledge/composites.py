"""Knowledge stage: what each composite overload calls (`composites.txt`), for `opscan coverage`.

tools/build_composites.py runs the sample inputs of PyTorch's OpInfo database on the CPU under a
TorchDispatchMode that re-dispatches every composite to its composite kernel, with the MPS view's device
branches applied, and records each composite's direct callees, one line per distinct callee set:

    # comments
    torch RELEASE GIT_VERSION            (the release the samples ran on)
    OVERLOAD SAMPLE [CALLEE ...]         (yaml spellings; SAMPLE = OpInfo#index[:out|:inplace])

No callee: the composite only built tensor metadata (a view). No torch import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from opscan.knowledge.table_text import header_and_rows, read_shipped

COMPOSITES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composites.txt")


@dataclass(frozen=True, eq=False)
class Composites:
    """overload -> ((sample, callees), ...), recorded on one torch release."""

    release: str
    git_version: str
    calls: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] = field(repr=False)

    @property
    def source(self) -> str:
        """How the callees were recorded, for Evidence.source."""
        return f"composites.txt (op_db samples under TorchDispatchMode on torch {self.release})"


def format_composites(release: str, git_version: str, edges: Mapping[str, Mapping[tuple, str]]) -> str:
    """composites.txt text; `edges`: overload -> {callees: sample}."""
    lines = [
        "# opscan: the direct callees of each composite overload, per distinct set, with the sample that showed it.",
        "# Written by tools/build_composites.py (op_db sample inputs on the CPU, composites re-dispatched to",
        "# their composite kernels, MPS device branches applied). OVERLOAD SAMPLE [CALLEE ...]",
        f"torch {release} {git_version}",
    ]
    for name in sorted(edges):
        for callees, sample in sorted(edges[name].items(), key=lambda kv: kv[1]):
            lines.append(" ".join([name, sample, *callees]))
    return "\n".join(lines) + "\n"


def parse_composites(text: str) -> Composites:
    """composites.txt text -> Composites (ValueError on a bad line)."""
    release, git, rows = header_and_rows(text)
    calls: dict[str, list] = {}
    for number, line, fields in rows:
        if len(fields) < 2 or "#" not in fields[1]:
            raise ValueError(f"composites.txt line {number}: {line!r}")
        calls.setdefault(fields[0], []).append((fields[1], tuple(fields[2:])))
    frozen = {k: tuple(v) for k, v in calls.items()}
    return Composites(release, git, MappingProxyType(frozen))


@functools.lru_cache(maxsize=2)
def load_composites(path: str = COMPOSITES_PATH) -> Composites | None:
    """The shipped callees (None when the file is absent)."""
    return read_shipped(path, parse_composites)
