"""Knowledge stage: the runtime checks inside each release's MPS kernels (`kernel_checks.txt`).

`tools/build_kernel_checks.py` reads them from the libtorch_cpu.dylib of every covered release's macOS
wheel: each call of a failure function (TORCH_CHECK, TORCH_CHECK_NOT_IMPLEMENTED, _TYPE, _VALUE, _INDEX)
that passes the path of a source file under aten/src/ATen/native/mps/, with its compiled __LINE__, the
function it sits in, its message and the aten overloads whose MPS kernel runs it. File layout:

    # comments
    release RELEASE GIT_VERSION                  (one per release read, in index order)
    ID MACRO KIND FILE:LINE RELEASE FUNCTION VIA RELEASES OPS MESSAGE     (tab-separated)

RELEASE is the newest release that has the check (its line and commit are that release's); RELEASES
lists every release that has it (`2.3.0-2.8.0,2.10.0-2.14.1`, ranges over index order); OPS the yaml
spellings of the overloads it belongs to (`-`: none); KIND is read from the message by `kind_of`:
`dtype`, `rank`, `size`, `flag`, `macos` (joined with `+`), or `other`. kernel_rules.yaml says which
checks opscan encodes. No torch import.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from opscan.knowledge.table_text import read_shipped

CHECKS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_checks.txt")
CHECK_KINDS = ("dtype", "rank", "size", "flag", "macos")
_WORDS = {
    "macos": r"mac ?os",
    "dtype": r"dtypes?|types?|float\w*|half|bfloat16|bf16|fp16|int\d*|long|complex|bool\w*|integ\w+|double"
             r"|uint8|byte",
    "rank": r"\d-?d|dims?|dimensions?|dimensional|rank|ndim|vector|matri(x|ces)|scalar|batch",
    "size": r"sizes?|shapes?|channels|elements|numel|length|large|larger|exceeds?|greater|smaller|"
            r"divisible|bytes|empty|bounds|range|even|> ?\d+|<= ?\d+|2\*\*\d+|64-bit|kernel volume",
    "flag": r"mode|dropout|pivot|reduction|reduce|interpolation|driver|bias|align_corners|causal|"
            r"beta|upper|lower|unbiased|argument|option|weight|ord|p=|norm|replacement|generator|out=|"
            r"projections",
}
_PATTERNS = {k: re.compile(rf"(?<!\w)(?:{w})" + ("" if k == "macos" else r"(?!\w)"), re.I) for k, w in _WORDS.items()}
_OTHER = re.compile(r"same device|same gpu|on the same|must be on|expected on|device as|device type|"
                    r"contiguous|cpu tensor|same storage|overlap|alias|strided|layout|sparse|quantized|"
                    r"nested", re.I)


def kind_of(message: str) -> str:
    """What a check depends on, read from its message: `+`-joined CHECK_KINDS, or "other"."""
    if _OTHER.search(message):
        return "other"
    found = [k for k in CHECK_KINDS if _PATTERNS[k].search(message)]
    return "+".join(found) or "other"


@dataclass(frozen=True)
class KernelCheck:
    """One runtime check of an MPS kernel."""

    id: str
    macro: str
    kind: str
    file: str  # path from aten/ on
    line: int | None
    release: str  # the newest release that has it (the line is that release's)
    commit: str  # that release's git_version
    function: str
    via: str  # kernel | caller | name | generic | -
    releases: frozenset[str]
    ops: tuple[str, ...]
    message: str

    @property
    def where(self) -> str:
        """`aten/.../Convolution.mm:1143 (torch 2.14.1, pytorch/pytorch@5c48869)`."""
        line = f":{self.line}" if self.line else ""
        return f"{self.file}{line} (torch {self.release}, pytorch/pytorch@{self.commit[:7]})"

    @property
    def encodable(self) -> bool:
        """Whether the message names something a traced call shows (dtype, rank, size, flag, macOS)."""
        return self.kind != "other"


@dataclass(frozen=True, eq=False)
class KernelChecks:
    """Every check of kernel_checks.txt, with per-release views."""

    releases: tuple[str, ...]  # in index order
    commits: Mapping[str, str]
    checks: tuple[KernelCheck, ...]

    def for_release(self, release: str) -> Mapping[str, tuple[KernelCheck, ...]]:
        """yaml overload name -> the checks its MPS kernel has in `release` (empty when not read)."""
        return _by_op(self, release)

    def count(self, release: str) -> int:
        """How many checks `release`'s MPS sources have."""
        return sum(release in c.releases for c in self.checks)


@functools.lru_cache(maxsize=64)
def _by_op(checks: KernelChecks, release: str) -> Mapping[str, tuple[KernelCheck, ...]]:
    """KernelChecks.for_release (cached)."""
    out: dict[str, list[KernelCheck]] = {}
    for check in checks.checks:
        if release in check.releases:
            for op in check.ops:
                out.setdefault(op, []).append(check)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


def check_id(file: str, function: str, macro: str, message: str) -> str:
    """A stable id: `kc-` and 8 hex digits of the check's identity."""
    return "kc-" + hashlib.sha1(f"{file}|{function}|{macro}|{message}".encode()).hexdigest()[:8]  # noqa: S324 - a short stable id, not a security digest


def ranges(members: set[str], order: Sequence[str]) -> str:
    """`2.3.0-2.8.0,2.10.0` for the members of `order` (runs of consecutive releases)."""
    runs, current = [], []
    for release in order:
        if release in members:
            current.append(release)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return ",".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def expand(text: str, order: Sequence[str]) -> frozenset[str]:
    """The inverse of `ranges`."""
    out = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        i = order.index(first)
        j = order.index(last) if last else i
        out.update(order[i:j + 1])
    return frozenset(out)


def _escape(message: str) -> str:
    return message.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n"}.get(m.group(1), m.group(1)), text)


def format_checks(order: Sequence[str], per_release: Mapping[str, tuple[str, list]]) -> str:
    """kernel_checks.txt text; `per_release`: release -> (git_version, [(site, via, ops)])."""
    merged: dict[tuple, dict] = {}
    for release in order:
        commit, found = per_release[release]
        for site, via, ops in found:
            message = " … ".join(site.parts) or "(no message)"
            function = _function(site.symbol)
            key = (site.file, function, site.macro, message)
            row = merged.setdefault(key, {"releases": set()})
            row["releases"].add(release)
            row.update(line=site.line, release=release, via=via, ops=sorted(ops))
    lines = [
        "# opscan: the runtime checks compiled into the MPS kernels of each covered torch release.",
        "# Written by tools/build_kernel_checks.py from each release's macOS arm64 wheel (libtorch_cpu.dylib);",
        "# see opscan/knowledge/kernel_checks.py. Columns (tab-separated):",
        "# ID MACRO KIND FILE:LINE RELEASE FUNCTION VIA RELEASES OPS MESSAGE",
    ]
    lines += [f"release {r} {per_release[r][0]}" for r in order]
    rows = []
    for (file, function, macro, message), row in merged.items():
        rows.append("\t".join([
            check_id(file, function, macro, message), macro, kind_of(message),
            f"{file}:{row['line'] or 0}", row["release"], function, row["via"],
            ranges(row["releases"], order), ",".join(row["ops"]) or "-", _escape(message)]))
    return "\n".join(lines + sorted(rows)) + "\n"


def _function(symbol: str) -> str:
    """A readable function name from a mangled symbol (the at::native name when there is one)."""
    match = re.search(r"2at6native(?:3mps)?L?(\d+)", symbol)
    if match is None:
        return symbol
    return symbol[match.end():match.end() + int(match.group(1))]


def parse_checks(text: str) -> KernelChecks:
    """kernel_checks.txt text -> KernelChecks (ValueError on a malformed line)."""
    order, commits, rows = [], {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        if line.startswith("release "):
            _, release, commit = line.split(" ")
            order.append(release)
            commits[release] = commit
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise ValueError(f"kernel_checks.txt line {number}: {line[:80]!r}")
        rows.append(fields)
    checks = tuple(_check(f, order, commits) for f in rows)
    return KernelChecks(tuple(order), MappingProxyType(commits), checks)


def _check(fields: list[str], order: list[str], commits: dict[str, str]) -> KernelCheck:
    cid, macro, kind, at, release, function, via, members, ops, message = fields
    file, _, line = at.rpartition(":")
    return KernelCheck(cid, macro, kind, file, int(line) or None, release, commits[release], function, via,
                       expand(members, order), tuple(ops.split(",")) if ops != "-" else (), _unescape(message))


@functools.lru_cache(maxsize=2)
def load_checks(path: str = CHECKS_PATH) -> KernelChecks | None:
    """The shipped checks (None when the file is absent)."""
    return read_shipped(path, parse_checks)
