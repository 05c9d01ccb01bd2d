"""Knowledge stage: which aten overloads each OpInfo of PyTorch's op_db dispatches.

common_mps.py keys its expectations by OpInfo name ("nn.functional.conv2d", "scatter_reducemean");
a trace holds aten overloads. `opinfo_map.txt` (package data, written by
tools/build_opinfo_map.py by running op_db's sample inputs on the CPU under a TorchDispatchMode)
says, per OpInfo, which overloads carry its expectations and by which method (`name`, `samples`,
`none`; the tool's docstring defines them). Lines:

    # comments
    torch RELEASE GIT_VERSION          (the release the samples ran on)
    OPINFO DTYPE SAMPLES METHOD MPS_DTYPES [OVERLOAD ...]   (yaml spelling)

MPS_DTYPES are the dtypes PyTorch's MPS tests run the OpInfo in (comma-separated, `-` for none).

An overload matches an OpInfo when it is listed, or shares a structured delegate with a listed
overload (`add_.Tensor` and `add.Tensor` both delegate to `add.out`). No torch import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from opscan.knowledge.table_text import header_and_rows, read_shipped

MAP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opinfo_map.txt")
METHODS = ("name", "samples", "none")


@dataclass(frozen=True)
class Mapped:
    """One OpInfo's attribution."""

    opinfo: str
    dtype: str  # the dtype its samples ran in
    samples: int  # samples that ran
    method: str  # name | samples | none
    mps_dtypes: frozenset[str]  # the dtypes its MPS tests run in
    overloads: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class OpinfoMap:
    """The whole map, with a reverse index from overload to OpInfo names."""

    release: str
    git_version: str
    rows: Mapping[str, Mapped] = field(repr=False)
    by_overload: Mapping[str, tuple[str, ...]] = field(repr=False)

    @property
    def source(self) -> str:
        """How the map was made, for Evidence.source."""
        return f"opinfo_map.txt (op_db samples under TorchDispatchMode on torch {self.release})"


def format_map(release: str, git_version: str, rows: Mapping[str, tuple]) -> str:
    """opinfo_map.txt text; `rows`: OpInfo -> (dtype, samples, method, mps dtypes, overloads)."""
    lines = [
        "# opscan: the aten overloads that carry each OpInfo's MPS expectations (common_mps.py keys).",
        "# Written by tools/build_opinfo_map.py (op_db sample inputs run on the CPU under a",
        "# TorchDispatchMode); methods `name`, `samples`, `none` are defined in that tool's docstring.",
        "# OPINFO DTYPE SAMPLES METHOD MPS_DTYPES [OVERLOAD ...]",
        f"torch {release} {git_version}",
    ]
    for name in sorted(rows):
        dtype, samples, method, mps_dtypes, overloads = rows[name]
        lines.append(" ".join([name, dtype, str(samples), method, ",".join(mps_dtypes) or "-", *overloads]))
    return "\n".join(lines) + "\n"


def parse_map(text: str) -> OpinfoMap:
    """opinfo_map.txt text -> OpinfoMap (ValueError on a bad line)."""
    release, git, lines = header_and_rows(text)
    rows: dict[str, Mapped] = {}
    for number, line, fields in lines:
        if len(fields) < 5 or fields[3] not in METHODS or not fields[2].isdigit() or fields[0] in rows:
            raise ValueError(f"opinfo_map.txt line {number}: {line!r}")
        tested = frozenset(fields[4].split(",")) - {"-"}
        rows[fields[0]] = Mapped(fields[0], fields[1], int(fields[2]), fields[3], tested, tuple(fields[5:]))
    reverse: dict[str, list[str]] = {}
    for row in rows.values():
        for overload in row.overloads:
            reverse.setdefault(overload, []).append(row.opinfo)
    frozen = {k: tuple(v) for k, v in reverse.items()}
    return OpinfoMap(release, git, MappingProxyType(rows), MappingProxyType(frozen))


@functools.lru_cache(maxsize=2)
def load_opinfo_map(path: str = MAP_PATH) -> OpinfoMap | None:
    """The shipped map (None when the file is absent)."""
    return read_shipped(path, parse_map)
