"""Knowledge stage: MPS's known silent-correctness bugs (`silent_bugs.yaml`), each a condition on a traced call.

An entry names the ops it concerns (as MPS dispatches them), the condition in conditions.py's language over the
op's arguments (named by its schema: knowledge/signatures.txt, bound by predict/bind.py), the releases it affects
and the release that fixes it (or "open"), the macOS range and chip families it is limited to, the workaround, how
its releases were established and its source. `load_bugs()` reads and validates the file (ValueError naming the
entry on anything malformed); `bugs_for_release(release)` is the entries that affect a release, by op
(Knowledge.silent). Each entry also keeps the day it was reported and the day its fix merged
(tools/silent/establish.py checks its releases against them; the recall measure in docs/silent-bugs.md splits the
entries by the day). No torch import.
"""

from __future__ import annotations

import ast
import datetime
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from opscan.knowledge.conditions import compile_when, names_read
from opscan.knowledge.schema import derived, entry_values
from opscan.knowledge.signatures import load_signatures, names_for
from opscan.opkey import Macos, OpKey, Release, ReleaseRange, macos_text, parse_macos

BUGS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "silent_bugs.yaml")
CONDITION_KINDS = frozenset({"non-contiguous", "storage-offset", "channels-last", "stride", "size", "dtype", "rank",
                   "cpu-meets-mps", "requires-grad", "macos", "chip", "argument"})  # argument: a flag's value
CHIPS = ("M1", "M2", "M3", "M4", "M5")
CONFIDENCE = ("high", "medium", "low")
OPEN = "open"
@dataclass(frozen=True)
class SilentBug:
    """One known silent-correctness bug: where it applies and what to do about it."""

    id: str
    title: str
    issues: tuple[int, ...]
    reported: str  # the day it was first reported (or its regression test landed), YYYY-MM-DD
    fix_pr: int | None
    fix_merged: str | None  # the day the fixing PR merged on main, YYYY-MM-DD (None: not known, or open)
    ops: tuple[str, ...]  # yaml spellings of MPS-view ops
    when: Mapping[str, str]  # op -> condition text
    code: Mapping[str, ast.Expression] = derived()  # op -> compiled condition
    kinds: tuple[str, ...]
    affected: ReleaseRange  # from the first affected release to the last affected series ("2.8.0..2.8")
    fixed_in: str | None  # None: open
    macos: tuple[Macos | None, Macos | None]  # [from, below)
    chip: tuple[str, ...]  # () = any chip
    workaround: str
    established: str
    confidence: str
    source: str

    @property
    def rule(self) -> str:
        """The rule id a verdict from this entry carries."""
        return f"silent-bug-{self.id}"

    @property
    def fixed(self) -> str:
        """The fixing release, or "open"."""
        return self.fixed_in or OPEN

    @property
    def first(self) -> str:
        """The first affected release: "2.8.0"."""
        return str(self.affected.spans[0][0])

    @property
    def last(self) -> str:
        """The last affected release series: "2.8"."""
        return str(self.affected.spans[0][1])

    @property
    def releases(self) -> str:
        """"2.8.0 – 2.8.x" as text."""
        return f"{self.first} – {self.last}.x"

    @property
    def size_condition(self) -> bool:
        """Whether the condition is on sizes (a probe must then run at the call's real size)."""
        return "size" in self.kinds

    def macos_applies(self, macos: Macos) -> bool:
        """Whether the bug shows on that macOS."""
        low, below = self.macos
        return (low is None or macos >= low) and (below is None or macos < below)

    @property
    def macos_text(self) -> str | None:
        """"macOS >= 15.0", "macOS 15.0 – 26.3" style text, or None for any."""
        low, below = self.macos
        if low is None and below is None:
            return None
        if below is None:
            return f"macOS {macos_text(low)} or later"
        return (f"macOS {macos_text(low)} up to (not including) {macos_text(below)}" if low
                else f"macOS before {macos_text(below)}")


def _macos(raw, where: str):
    if raw is None:
        return None, None
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError(f"{where}: macos must be [from, below] (null for open ends)")
    try:
        return tuple(None if v is None else parse_macos(v) for v in raw)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def parse_bugs(text: str) -> tuple[SilentBug, ...]:
    """silent_bugs.yaml text -> its entries; ValueError naming the first bad entry."""
    data = yaml.safe_load(text) or {}
    if set(data) - {"schema", "entries"}:
        raise ValueError(f"silent_bugs.yaml: unknown top-level keys {sorted(set(data) - {'schema', 'entries'})} "
                         "(argument names come from the schemas: knowledge/signatures.txt)")
    seen, out = set(), []
    for raw in data.get("entries") or ():
        bug = _entry(raw)
        if bug.id in seen:
            raise ValueError(f"silent_bugs.yaml: entry {bug.id!r} appears twice")
        seen.add(bug.id)
        out.append(bug)
    return tuple(out)


def _entry(raw) -> SilentBug:
    entry_values(SilentBug, raw, "silent_bugs.yaml", "entry")  # its keys are SilentBug's fields
    where = f"silent_bugs.yaml: entry {raw['id']!r}"
    ops = tuple(str(o) for o in raw["ops"])
    for op in ops:
        OpKey.from_yaml(op)
    when = raw["when"] if isinstance(raw["when"], dict) else dict.fromkeys(ops, raw["when"])
    if set(when) != set(ops):
        raise ValueError(f"{where}: `when` must give a condition for every op and no other")
    fixed = None if raw["fixed_in"] == OPEN else str(raw["fixed_in"])
    affected = _affected(where, raw["affected"], fixed)
    kinds, chip = tuple(raw["kinds"]), tuple(raw["chip"] or ())
    if not kinds or set(kinds) - CONDITION_KINDS or set(chip) - set(CHIPS) or raw["confidence"] not in CONFIDENCE:
        raise ValueError(f"{where}: kinds must be among {sorted(CONDITION_KINDS)}, chips among {CHIPS}, "
                         f"confidence one of {CONFIDENCE}")
    for key in ("title", "workaround", "established", "source"):
        if not str(raw[key]).strip():
            raise ValueError(f"{where}: {key} is empty")
    code = {op: compile_when(str(text)) for op, text in when.items()}
    _check_names(where, code, affected)
    reported, merged = _date(raw["reported"], where), _date(raw["fix_merged"], where)
    if reported is None:
        raise ValueError(f"{where}: reported is empty")
    return SilentBug(str(raw["id"]), raw["title"], tuple(int(i) for i in raw["issues"]), reported, raw["fix_pr"],
                     merged, ops,
                     MappingProxyType(dict(when)), MappingProxyType(code), kinds, affected, fixed,
                     _macos(raw["macos"], where), chip, raw["workaround"], raw["established"], raw["confidence"],
                     raw["source"])


def _check_names(where: str, code: Mapping[str, ast.Expression], affected: ReleaseRange) -> None:
    """Each op's condition reads only names its schema gives in every covered release the entry affects."""
    table = load_signatures()
    for op, compiled in code.items():
        for release in (r for r in (table.releases if table else ()) if affected.covers(r)):
            names = names_for(op, release)
            if names is None or not names_read(compiled) <= names:
                raise ValueError(f"{where}: op {op}: its condition reads "
                                 f"{sorted(names_read(compiled) - (names or frozenset()))}, which its schema in "
                                 f"torch {release} does not name (knowledge/signatures.txt)")


def _date(value, where: str) -> str | None:
    """A YYYY-MM-DD day as text (None stays None); ValueError naming the entry otherwise."""
    if value is None:
        return None
    try:
        return datetime.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a YYYY-MM-DD day") from None


def _affected(where: str, pair, fixed: str | None) -> ReleaseRange:
    """`affected` ([first release, last series]) as a range, the fix (if any) after it."""
    try:
        first, last = (str(v) for v in pair)
        affected, fix = ReleaseRange.between(first, last), Release.parse(fixed) if fixed else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: affected: {exc}") from None
    if Release.parse(last).series != last or (fix is not None and fix.series_key <= Release.parse(last).series_key):
        raise ValueError(f"{where}: affected must be [first release, last series] with the fix after both")
    return affected


@functools.lru_cache(maxsize=2)
def load_bugs(path: str = BUGS_PATH) -> tuple[SilentBug, ...]:
    """The shipped entries."""
    with open(path, encoding="utf-8") as fh:
        return parse_bugs(fh.read())


@functools.lru_cache(maxsize=64)
def bugs_for_release(release: str, path: str = BUGS_PATH) -> Mapping[str, tuple[SilentBug, ...]]:
    """yaml op name -> the entries that affect `release`."""
    by_op: dict[str, list[SilentBug]] = {}
    for bug in load_bugs(path):
        if bug.affected.covers(release):
            for op in bug.ops:
                by_op.setdefault(op, []).append(bug)
    return MappingProxyType({op: tuple(bugs) for op, bugs in by_op.items()})
