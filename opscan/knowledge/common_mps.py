"""Knowledge stage: PyTorch's own MPS test expectations, from a release's `common_mps.py` records.

`torch/testing/_internal/common_mps.py` (in wheels from 2.8.0 on) keeps its lists as local
variables of functions defined only when MPS is available, so importing it on Linux yields nothing;
sources.py parses it with `ast` into `complex` and `xfail` records (mps_facts.md §3). This module
answers questions about those records for an assumed macOS version:

* `supported_complex(macos)`: SUPPORTED_COMPLEX_OPS, plus 2.8's AFTER_MACOS_14_0_SUPPORTED_COMPLEX_OPS
  from macOS 14.0 on;
* `xfail(list, macos)`: OpInfo name -> failing dtypes (None = every dtype), a conditional entry
  (`A if MACOS_VERSION < V else B`, `if MACOS_VERSION < V: LIST.update(...)`) overriding the
  unconditional one when it applies; `MACOS_BEFORE_X_Y_*` lists apply only below macOS X.Y.

Keys are OpInfo names (`op.name + op.variant_test_name`, e.g. "nn.functional.conv2d"), not aten
overloads: opinfo.py maps them; `opinfo_candidates` is the by-name fallback.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from opscan.knowledge.build import COMMON_MPS, installed_file
from opscan.knowledge.sources import COMPLEX_LISTS, common_mps_records
from opscan.opkey import Macos, parse_macos

# OpInfo name prefixes whose aten spelling joins with "_" instead of ".": linalg_svd -> linalg.svd.
_DOTTED = ("linalg", "special", "fft", "sparse")
_BEFORE = re.compile(r"^MACOS_BEFORE_(\d+)_(\d+)_")


def _holds(condition: str, macos: Macos | None) -> bool:
    """Whether `macos<15.0` / `macos>=15.0` holds (a condition never holds for macos None)."""
    if not condition:
        return True
    if macos is None:
        return False
    op, version = ("<", condition[6:]) if condition[5] == "<" else (">=", condition[7:])
    return (macos < parse_macos(version)) == (op == "<")


@dataclass(frozen=True, eq=False)
class CommonMps:
    """The `complex` and `xfail` records of one release's common_mps.py."""

    path: str  # where they came from, for messages
    records: frozenset[str]

    def supported_complex(self, macos: Macos | None = None) -> frozenset[str]:
        """OpInfo names PyTorch expects to work in complex64 on MPS (macos None: every list)."""
        lists = COMPLEX_LISTS if macos is None or macos >= (14, 0) else COMPLEX_LISTS[:1]
        return _complex(self, lists)

    def xfail(self, name: str, macos: Macos | None = None) -> Mapping[str, tuple[str, ...] | None]:
        """OpInfo -> failing dtypes of list `name` at `macos` (None: unconditional entries only)."""
        gate = _BEFORE.match(name)
        if gate and (macos is None or macos >= (int(gate.group(1)), int(gate.group(2)))):
            return MappingProxyType({})
        return _xfail(self, name, macos)

    def gate_of(self, name: str, opinfo: str, macos: Macos) -> str | None:
        """V of the `macos<V` record of list `name` for `opinfo` that holds at `macos`, or None."""
        for record in self.records:
            fields = record.split(" ")
            if (fields[0] == "xfail" and fields[1:3] == [name, opinfo] and len(fields) > 4
                    and fields[4].startswith("macos<") and _holds(fields[4], macos)):
                return fields[4][6:]
        return None

    @property
    def unimplemented(self) -> Mapping[str, tuple[str, ...] | None]:
        """UNIMPLEMENTED_XFAILLIST's unconditional entries."""
        return self.xfail("UNIMPLEMENTED_XFAILLIST")

    def note(self, name: str, opinfo: str) -> str | None:
        """The comment PyTorch wrote on entry `opinfo` of list `name` (its `note` record), or None."""
        prefix = f"note {name} {opinfo} "
        return next((r[len(prefix):] for r in sorted(self.records) if r.startswith(prefix)), None)

    def lists(self) -> tuple[str, ...]:
        """The xfail list names present."""
        return tuple(sorted({r.split(" ")[1] for r in self.records if r.startswith("xfail ")}))

    def complex_match(self, aten_name: str, macos: Macos | None = None) -> str | None:
        """The supported-complex OpInfo name that `aten_name` matches by spelling, or None."""
        supported = self.supported_complex(macos)
        return next((c for c in opinfo_candidates(aten_name) if c in supported), None)


@functools.lru_cache(maxsize=64)
def _complex(lists: CommonMps, names: tuple[str, ...]) -> frozenset[str]:
    """Union of the `complex` records of the given lists (cached)."""
    return frozenset(r.split(" ")[2] for r in lists.records
                     if r.startswith("complex ") and r.split(" ")[1] in names)


@functools.lru_cache(maxsize=256)
def _xfail(lists: CommonMps, name: str, macos: Macos | None) -> Mapping[str, tuple[str, ...] | None]:
    """One xfail list resolved at `macos` (cached)."""
    plain: dict[str, tuple[str, ...] | None] = {}
    gated: dict[str, tuple[str, ...] | None] = {}
    for record in lists.records:
        fields = record.split(" ")
        if fields[0] != "xfail" or fields[1] != name:
            continue
        cond = fields[4] if len(fields) > 4 else ""
        if _holds(cond, macos):
            (gated if cond else plain)[fields[2]] = None if fields[3] == "*" else tuple(fields[3].split(","))
    return MappingProxyType({**plain, **gated})


def from_records(records: Iterable[str], path: str) -> CommonMps | None:
    """CommonMps of a release's records, or None when it has none (no common_mps.py before 2.8)."""
    kept = frozenset(r for r in records if r.startswith(("complex ", "xfail ", "note ")))
    return CommonMps(path, kept) if kept else None


def opinfo_candidates(aten_name: str) -> tuple[str, ...]:
    """OpInfo names an aten op name may correspond to, matched by spelling only.

    The name itself; without one trailing "_" (in-place variant: "add_" -> "add", dunders kept);
    without one leading "_" ("_conj" -> "conj"); "nn.functional.<name>"; and for linalg_/special_/
    fft_/sparse_ names the dotted form ("linalg_svd" -> "linalg.svd"). Variant OpInfos
    ("divno_rounding_mode") never match: opinfo.py's sample-based map covers those."""
    base = aten_name
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    names = [base]
    if base.startswith("_") and not base.startswith("__"):
        names.append(base[1:])
    for name in list(names):
        names.append(f"nn.functional.{name}")
        prefix, sep, rest = name.partition("_")
        if sep and prefix in _DOTTED:
            names.append(f"{prefix}.{rest}")
    return tuple(dict.fromkeys(names))


def installed_path() -> str | None:
    """common_mps.py of the installed torch, located without importing torch (None if absent)."""
    return installed_file(COMMON_MPS)


@functools.lru_cache(maxsize=4)
def load_common_mps(path: str) -> CommonMps:
    """Parse a common_mps.py file (never imported); ValueError when it lacks the two main lists."""
    with open(path, encoding="utf-8") as fh:
        lists = CommonMps(path, frozenset(common_mps_records(fh.read())))
    if not lists.supported_complex() or "UNIMPLEMENTED_XFAILLIST" not in lists.lists():
        raise ValueError(f"{path}: SUPPORTED_COMPLEX_OPS or UNIMPLEMENTED_XFAILLIST not found")
    return lists
