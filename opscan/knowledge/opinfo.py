"""Knowledge stage: which aten overloads each OpInfo of PyTorch's op_db dispatches.

common_mps.py keys its expectations by OpInfo name ("nn.functional.conv2d", "scatter_reducemean");
a trace holds aten overloads. `opinfo_map.txt` (package data, written by
tools/build_opinfo_map.py by running op_db's sample inputs on the CPU under a TorchDispatchMode)
says, per OpInfo, which overloads carry its expectations and by which method (`name`, `samples`,
`none`; the tool's docstring defines them). Lines:

    # comments
    torch RELEASE GIT_VERSION          (the release the samples ran on)
    OPINFO DTYPE SAMPLES METHOD MPS_DTYPES [OVERLOAD ...]   (yaml spelling)
    OPINFO DTYPE SAMPLES dispatch - [OVERLOAD ...]          (after the OpInfo's own line)

MPS_DTYPES are the dtypes PyTorch's MPS tests run the OpInfo in (comma-separated, `-` for none).
A `dispatch` line lists every overload that its samples in DTYPE (complex64) dispatched with a
tensor of that dtype in or out, unfiltered: the ops a passing complex64 test ran (`Mapped.dispatched`).

An overload matches an OpInfo when it is listed, or shares a structured delegate with a listed
overload (`add_.Tensor` and `add.Tensor` both delegate to `add.out`). No torch import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from opscan.knowledge.table_text import header_and_rows, read_shipped

MAP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opinfo_map.txt")
METHODS = ("name", "samples", "none")
DISPATCH = "dispatch"


@dataclass(frozen=True)
class Mapped:
    """One OpInfo's attribution."""

    opinfo: str
    dtype: str  # the dtype its samples ran in
    samples: int  # samples that ran
    method: str  # name | samples | none
    mps_dtypes: frozenset[str]  # the dtypes its MPS tests run in
    overloads: tuple[str, ...]
    # dtype -> every overload its samples in that dtype dispatched with such a tensor (`dispatch` lines)
    dispatched: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, eq=False)
class OpinfoMap:
    """The whole map, with a reverse index from overload to OpInfo names."""

    release: str
    git_version: str
    rows: Mapping[str, Mapped] = field(repr=False)
    by_overload: Mapping[str, tuple[str, ...]] = field(repr=False)
    # dtype -> overload -> OpInfos whose samples in that dtype dispatched it (the `dispatch` lines)
    by_dispatch: Mapping[str, Mapping[str, tuple[str, ...]]] = field(
        repr=False, default_factory=lambda: MappingProxyType({}))

    @property
    def source(self) -> str:
        """How the map was made, for Evidence.source."""
        return f"opinfo_map.txt (op_db samples under TorchDispatchMode on torch {self.release})"


def format_map(release: str, git_version: str, rows: Mapping[str, tuple],
               dispatched: Mapping[str, Mapping[str, tuple]] | None = None) -> str:
    """opinfo_map.txt text; `rows`: OpInfo -> (dtype, samples, method, mps dtypes, overloads);
    `dispatched`: dtype -> OpInfo -> (samples, overloads) of its `dispatch` lines."""
    lines = [
        "# opscan: the aten overloads that carry each OpInfo's MPS expectations (common_mps.py keys).",
        "# Written by tools/build_opinfo_map.py (op_db sample inputs run on the CPU under a",
        "# TorchDispatchMode); methods `name`, `samples`, `none` are defined in that tool's docstring;",
        "# a `dispatch` line: every overload its samples in DTYPE dispatched with a DTYPE tensor in or out.",
        "# OPINFO DTYPE SAMPLES METHOD MPS_DTYPES [OVERLOAD ...]",
        f"torch {release} {git_version}",
    ]
    for name in sorted(rows):
        dtype, samples, method, mps_dtypes, overloads = rows[name]
        lines.append(" ".join([name, dtype, str(samples), method, ",".join(mps_dtypes) or "-", *overloads]))
        for kind in sorted(dispatched or {}):
            if name in dispatched[kind]:
                count, ops = dispatched[kind][name]
                lines.append(" ".join([name, kind, str(count), DISPATCH, "-", *ops]))
    return "\n".join(lines) + "\n"


def parse_map(text: str) -> OpinfoMap:
    """opinfo_map.txt text -> OpinfoMap (ValueError on a bad line)."""
    release, git, lines = header_and_rows(text)
    rows: dict[str, Mapped] = {}
    extra: dict[str, dict[str, tuple[str, ...]]] = {}
    for number, line, fields in lines:
        method = fields[3] if len(fields) >= 5 else ""
        known = fields[1] in extra.get(fields[0], {})
        if method == DISPATCH and fields[0] in rows and fields[2].isdigit() and not known:
            extra.setdefault(fields[0], {})[fields[1]] = tuple(fields[5:])
            continue
        if method not in METHODS or not fields[2].isdigit() or fields[0] in rows:
            raise ValueError(f"opinfo_map.txt line {number}: {line!r}")
        tested = frozenset(fields[4].split(",")) - {"-"}
        rows[fields[0]] = Mapped(fields[0], fields[1], int(fields[2]), method, tested, tuple(fields[5:]))
    for name, per_dtype in extra.items():
        rows[name] = replace(rows[name], dispatched=MappingProxyType(per_dtype))
    return OpinfoMap(release, git, MappingProxyType(rows), _reverse(rows.values(), lambda r: r.overloads),
                     MappingProxyType({dtype: _reverse(rows.values(), lambda r, d=dtype: r.dispatched.get(d, ()))
                                       for dtype in {d for r in rows.values() for d in r.dispatched}}))


def _reverse(rows, overloads_of) -> Mapping[str, tuple[str, ...]]:
    """overload -> the OpInfos whose `overloads_of(row)` list it."""
    reverse: dict[str, list[str]] = {}
    for row in rows:
        for overload in overloads_of(row):
            reverse.setdefault(overload, []).append(row.opinfo)
    return MappingProxyType({k: tuple(v) for k, v in reverse.items()})


@functools.lru_cache(maxsize=2)
def load_opinfo_map(path: str = MAP_PATH) -> OpinfoMap | None:
    """The shipped map (None when the file is absent)."""
    return read_shipped(path, parse_map)
