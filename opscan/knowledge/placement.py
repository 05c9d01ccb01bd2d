"""Knowledge stage: what each MPS kernel does with a host tensor (`placement.yaml`, `placement_ti.txt`).

A `PlacementRule` says, for the ops it names at the releases its sources establish, which tensor arguments are
which (`arguments`), which host tensors the kernel takes (`takes`), which it is not known to (`unknown`), and what
refuses the others (`path`, with its message). `placement_rule(op, release, in_table)` finds the rule that decides an
op at a release; predict/placement.py applies it to a call. No torch import.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from opscan.opkey import OpKey, Release

_HERE = os.path.dirname(os.path.abspath(__file__))
PLACEMENT_PATH = os.path.join(_HERE, "placement.yaml")
TI_PATH = os.path.join(_HERE, "placement_ti.txt")
HOW = ("any", "zero-dim", "cpu-scalar")  # what a kernel takes of a host tensor (see placement.yaml)
_FIELDS = {"id", "ops", "ops_table", "first", "last", "arguments", "takes", "unknown", "path", "message", "source"}


@dataclass(frozen=True)
class KernelPath:
    """A way an MPS kernel reads a tensor argument, and what it says to a CPU one."""

    name: str
    text: str
    message: str | None
    source: str | None


@dataclass(frozen=True)
class PlacementRule:
    """One rule of placement.yaml."""

    id: str
    ops: frozenset[str]  # yaml spellings (a table's: the structured overloads of placement_ti.txt)
    first: Release
    last: Release | None
    arguments: tuple[str, ...]  # the call's tensors in order ("name*": a list); () = one group, "all"
    takes: MappingProxyType  # argument (or "all") -> HOW
    unknown: MappingProxyType  # likewise: the host tensors whose fate is not established
    path: KernelPath | None  # what refuses the rest (None: the rule takes every host tensor)
    message: str | None  # the refusal's message (the path's unless the rule has its own)
    source: str
    table: bool = False  # ops from placement_ti.txt: they count where the release has them structured

    def covers(self, release: Release) -> bool:
        """Whether the rule's sources establish it at `release`."""
        return self.first.numbers <= release.numbers and (self.last is None or release.numbers <= self.last.numbers)


def parse_placement(text: str, ti_ops: frozenset[str] = frozenset()) -> tuple[PlacementRule, ...]:
    """placement.yaml text -> rules (ValueError on a bad entry); `ti_ops`: placement_ti.txt's overloads."""
    data = yaml.safe_load(text) or {}
    paths = {name: KernelPath(name, raw["text"], raw.get("message"), raw.get("source"))
             for name, raw in (data.get("paths") or {}).items()}
    rules, seen = [], set()
    for raw in data.get("rules") or ():
        unknown_keys = set(raw) - _FIELDS
        if unknown_keys or {"id", "first", "source"} - set(raw) or ("ops" in raw) == ("ops_table" in raw):
            raise ValueError(f"placement.yaml: rule {raw.get('id')!r} has a bad set of keys ({sorted(raw)})")
        if raw["id"] in seen:
            raise ValueError(f"placement.yaml: rule {raw['id']!r} appears twice")
        seen.add(raw["id"])
        takes, unknown = (MappingProxyType(dict(raw.get(k) or {})) for k in ("takes", "unknown"))
        groups = {a.rstrip("*") for a in raw.get("arguments", ())} | {"all"}
        for key, how in (*takes.items(), *unknown.items()):
            if key not in groups or how not in HOW:
                raise ValueError(f"placement.yaml: rule {raw['id']!r}: {key}: {how} is not an argument and one of "
                                 f"{HOW}")
        path = raw.get("path")
        if path is not None and path not in paths:
            raise ValueError(f"placement.yaml: rule {raw['id']!r} names an unknown path {path!r}")
        if path is None and takes.get("all") != "any":
            raise ValueError(f"placement.yaml: rule {raw['id']!r} refuses host tensors but names no path")
        rules.append(PlacementRule(
            raw["id"], frozenset(raw["ops"]) if "ops" in raw else ti_ops, Release.parse(raw["first"]),
            Release.parse(raw["last"]) if raw.get("last") else None, tuple(raw.get("arguments", ())), takes,
            unknown, paths.get(path), raw.get("message") or (paths[path].message if path else None),
            raw["source"], "ops_table" in raw))
    return tuple(rules)


def parse_ti(text: str) -> tuple[str, frozenset[str]]:
    """placement_ti.txt -> (its `release ... sha256 ...` line, the overloads)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines or not lines[0].startswith("release "):
        raise ValueError("placement_ti.txt: no `release R sha256 H` line")
    return lines[0], frozenset(lines[1:])


@functools.lru_cache(maxsize=1)
def load_placement() -> tuple[PlacementRule, ...]:
    """The shipped rules."""
    with open(TI_PATH, encoding="utf-8") as fh:
        _, ti_ops = parse_ti(fh.read())
    with open(PLACEMENT_PATH, encoding="utf-8") as fh:
        return parse_placement(fh.read(), ti_ops)


def placement_rule(op: OpKey, release: str, in_table) -> PlacementRule | None:
    """The rule deciding `op` at `release`, or None; `in_table(name, ops)`: whether the release has the overload
    structured with its meta among a table rule's `ops` (its own, or its structured delegate's)."""
    if op.namespace != "aten":
        return None
    at = Release.parse(release)
    name = op.yaml_name
    for rule in load_placement():
        if rule.covers(at) and (in_table(name, rule.ops) if rule.table else name in rule.ops):
            return rule
    return None
