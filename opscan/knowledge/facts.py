"""Knowledge stage: the hand-kept, sourced facts of facts.yaml and torchvision.yaml.

Both files are package data, loaded with PyYAML's safe loader (its C version when available) and
validated on load: every entry has a non-empty `source`, every op name parses as an OpKey, every
release series is spelled "X.Y", no series is listed twice in one section, and every series of
`always_cpu` has the other per-release facts too. A bad file
raises `ValueError` naming the entry (it is a bug in opscan, not user input).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import yaml

from opscan.knowledge.schema import entry_values, spelled
from opscan.opkey import OpKey, Release

HERE = os.path.dirname(os.path.abspath(__file__))
FACTS_PATH = os.path.join(HERE, "facts.yaml")
TORCHVISION_PATH = os.path.join(HERE, "torchvision.yaml")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # same constructors as safe_load, in C
_PER_RELEASE = ("always_cpu", "python_registrations", "min_macos")


@dataclass(frozen=True)
class Fact:
    """One sourced fact about an op: what it says and where it comes from."""

    source: str
    message: str = ""


@dataclass(frozen=True)
class TorchvisionOp:
    """A torchvision op with an MPS kernel, and the first releases that have it."""

    op: OpKey
    since_torchvision: str
    since_torch: str
    source: str


@dataclass(frozen=True)
class DtypeLimit:
    """A dtype MPS lacks in a release series: entirely, or below a macOS version."""

    dtype: str
    message: str
    source: str
    min_macos: str | None = spelled("macos", default=None)  # the first macOS that has it; None: not at all


@dataclass(frozen=True)
class MinMacos:
    """The oldest macOS a release series runs MPS on."""

    macos: str
    source: str


@dataclass(frozen=True)
class Distributed:
    """c10d ops on MPS: refused from `error_since` on, with or without the fallback."""

    namespace: str
    error_since: str
    message: str
    source: str


@dataclass(frozen=True)
class EarlierPath:
    """What a release series ran where the installed torch dispatches `op`.

    Without `from_unit`: an op the series lacks (the installed torch's own decomposition dispatched it), judged
    as the one op it ran in its place (predict.rules). With `from_unit` (a torch Python function, "file:qualname",
    trace/frames.py): the series' own code of that function differs, and where the installed one issued `op` it
    issued the ops `ran` (none: nothing) — every such call, or with `rank` only those whose first output has
    that many dimensions; `ops` instead of `op` names a run of consecutive calls made inside the function (through its
    helpers too), all of them when empty, that becomes `ran` once; `via`: only when the function was called by
    that torch function (predict/python_paths.py applies these to the MPS view of a release of the series)."""

    ran: tuple[OpKey, ...]
    message: str
    source: str
    op: OpKey | None = None
    within: OpKey | None = None  # the C++ composite whose kernel made the call (composite_callees.txt checks it)
    from_unit: str | None = spelled("from", default=None)
    via: str | None = None
    ops: tuple[OpKey, ...] | None = None  # a run's ops (from_unit only); () = every call made inside from_unit
    rank: int | None = None


@dataclass(frozen=True)
class DeviceBranch:
    """A composite op whose kernel dispatches other ops for MPS input (every release 2.0-2.14)."""

    op: OpKey
    runs: tuple[OpKey, ...]
    condition: str
    source: str


@dataclass(frozen=True, eq=False)
class ReleaseFacts:
    """The facts of facts.yaml for one release series."""

    series: str
    always_cpu: Mapping[OpKey, Fact]
    error_stubs: Mapping[OpKey, Fact]
    python_registrations: Mapping[OpKey, Fact]
    min_macos: str
    min_macos_source: str
    distributed_error: Fact | None  # set when c10d ops cannot fall back in this series
    outside_yaml: Mapping[OpKey, Fact] = field(default_factory=dict)  # MPS kernels the yaml lacks
    dtype_limits: tuple[DtypeLimit, ...] = ()
    earlier_paths: Mapping[OpKey, EarlierPath] = field(default_factory=dict)  # ops this series lacks, and theirs
    python_paths: tuple[EarlierPath, ...] = ()  # earlier_paths with `from`: where this series' Python code differs
    device_branches: Mapping[OpKey, DeviceBranch] = field(default_factory=dict)  # what a composite runs on MPS


@dataclass(frozen=True, eq=False)
class Facts:
    """All of facts.yaml: per-series tables plus the order of the known series."""

    series: tuple[str, ...]
    sections: Mapping[str, Mapping[str, tuple]]  # section -> series -> entries
    distributed: Distributed
    count: int  # number of sourced entries, for kb_version
    device_branches: Mapping[OpKey, DeviceBranch] = field(default_factory=dict)

    def for_release(self, release: str) -> ReleaseFacts:
        """The facts for `release`'s series; ValueError when the series is unknown."""
        s = Release.parse(release).series
        if s not in self.series:
            raise ValueError(f"no MPS facts for torch {release}; known series: {', '.join(self.series)}")
        return _release_facts(self, s)

    def always_cpu_until(self, op: OpKey, release: str) -> str | None:
        """The first known series after `release` whose always-CPU list lacks `op`, or None."""
        later = [s for s in self.series if _series_key(s) > _series_key(release)]
        return next((s for s in later if op not in dict(self.sections["always_cpu"][s])), None)


def _per_series(entries: list[dict], section: str, value) -> dict[str, tuple]:
    """section entries -> {series: value(entry, section)}, rejecting bad or repeated series."""
    table: dict[str, tuple] = {}
    for entry in entries:
        for s in _series(entry, section):
            if s in table:
                raise ValueError(f"facts.yaml: {section}: repeated release series {s!r}")
            table[s] = value(entry, section)
    return table


def _series(entry, section: str) -> tuple[str, ...]:
    """An entry's `releases`: release series, each "X.Y"."""
    series = tuple(str(s) for s in (entry.get("releases") or ()) if isinstance(entry, dict))
    if not series or any(Release.parse(s).series != s for s in series):
        raise ValueError(f"facts.yaml: {section}: bad release series in {entry!r}")
    return series


def _op_facts(entry: dict, section: str) -> tuple:
    """An entry's ops as ((OpKey, Fact), ...)."""
    fact = Fact(**entry_values(Fact, entry, "facts.yaml", section, index=("releases", "ops", "op")))
    ops = entry["ops"] if "ops" in entry else [entry["op"]]
    return tuple((OpKey.from_yaml(o), fact) for o in ops)


def _min_macos(entry: dict, section: str) -> MinMacos:
    return MinMacos(**entry_values(MinMacos, entry, "facts.yaml", section, index=("releases",), macos=str))


def _dtype_limit(entry: dict, section: str) -> tuple:
    """A dtype_limits entry as a one-element tuple."""
    text = lambda v: str(v) if v else None  # noqa: E731
    return (DtypeLimit(**entry_values(DtypeLimit, entry, "facts.yaml", section, index=("releases",), dtype=str,
                                      macos=text)),)


def _earlier_path(entry: dict, section: str) -> tuple:
    """An earlier_paths entry as a one-element tuple (see EarlierPath)."""
    keys = lambda names: tuple(OpKey.from_yaml(str(o)) for o in names)  # noqa: E731
    text = lambda v: str(v) if v else None  # noqa: E731
    path = EarlierPath(**entry_values(
        EarlierPath, entry, "facts.yaml", section, index=("releases",), op=lambda op: OpKey.from_yaml(str(op)),
        ran=lambda ran: keys(ran if isinstance(ran, list) else [ran]), message=str, source=str, via=text,
        within=lambda op: OpKey.from_yaml(str(op)) if op else None, ops=lambda names: keys(names or ()),
        rank=lambda r: None if r is None else int(r), **{"from": text}))
    if path.from_unit is None and (path.op is None or path.ops is not None or len(path.ran) != 1):
        raise ValueError(f"earlier_paths: {entry!r} needs one `op` and one `ran` op, or a `from` function")
    if path.op is not None and path.ops is not None:
        raise ValueError(f"earlier_paths: {entry!r} names an `op` and a run of `ops`: one or the other")
    if path.from_unit is not None and path.op is None and path.ops is None:
        path = replace(path, ops=())  # no op named: the run of every call made inside the function
    return (path,)


def _device_branches(entries: list[dict]) -> Mapping[OpKey, DeviceBranch]:
    """The device_branches section: OpKey -> DeviceBranch."""
    table: dict[OpKey, DeviceBranch] = {}
    for entry in entries:
        branch = DeviceBranch(**entry_values(DeviceBranch, entry, "facts.yaml", "device_branches",
                                             op=OpKey.from_yaml, runs=lambda ops: tuple(map(OpKey.from_yaml, ops)),
                                             condition=str, source=str))
        if branch.op in table or not branch.runs:
            raise ValueError(f"device_branches: repeated op or nothing it runs in {entry!r}")
        table[branch.op] = branch
    return MappingProxyType(table)


def _series_sections(entries: list[dict], section: str, make) -> dict[str, tuple]:
    """series -> every entry of a section that applies to it (one series may have several)."""
    table: dict[str, tuple] = {}
    for entry in entries:
        for s in _series(entry, section):
            table[s] = table.get(s, ()) + make(entry, section)
    return table


def parse_facts(raw: dict) -> Facts:
    """Validate a loaded facts.yaml mapping and index it by release series."""
    if raw.get("schema") != 1:
        raise ValueError(f"facts.yaml: unsupported schema {raw.get('schema')!r}")
    sections = {
        "always_cpu": _per_series(raw["always_cpu"], "always_cpu", _op_facts),
        "python_registrations": _per_series(raw["python_registrations"], "python_registrations", _op_facts),
        "min_macos": _per_series(raw["min_macos"], "min_macos", _min_macos),
        "error_stubs": _per_series(raw["error_stubs"], "error_stubs", _op_facts),
        "outside_yaml": _per_series(raw.get("outside_yaml", []), "outside_yaml", _op_facts),
        "dtype_limits": _series_sections(raw.get("dtype_limits", []), "dtype_limits", _dtype_limit),
        "earlier_paths": _series_sections(raw.get("earlier_paths", []), "earlier_paths", _earlier_path),
    }
    series = tuple(sorted(sections["always_cpu"], key=_series_key))
    for name in _PER_RELEASE:
        if set(sections[name]) != set(series):
            covered = sorted(sections[name], key=_series_key)
            raise ValueError(f"facts.yaml: {name} covers {covered}, always_cpu {list(series)}")
    distributed = Distributed(**entry_values(Distributed, raw["distributed"], "facts.yaml", "distributed",
                                             error_since=str))
    count = sum(len(raw[k]) for k in ("always_cpu", "python_registrations", "min_macos", "error_stubs"))
    optional = ("outside_yaml", "dtype_limits", "earlier_paths", "device_branches")
    count += sum(len(raw.get(k, [])) for k in optional) + 1
    frozen = {k: MappingProxyType(v) for k, v in sections.items()}
    branches = _device_branches(raw.get("device_branches", []))
    return Facts(series, MappingProxyType(frozen), distributed, count, branches)


def _release_facts(facts: Facts, s: str) -> ReleaseFacts:
    """Assemble the facts of one known series."""
    sec = facts.sections
    dist = facts.distributed
    broken = _series_key(s) >= _series_key(dist.error_since)
    floor = sec["min_macos"][s]
    return ReleaseFacts(
        series=s,
        always_cpu=MappingProxyType(dict(sec["always_cpu"][s])),
        error_stubs=MappingProxyType(dict(sec["error_stubs"].get(s, ()))),
        python_registrations=MappingProxyType(dict(sec["python_registrations"][s])),
        min_macos=floor.macos,
        min_macos_source=floor.source,
        distributed_error=Fact(dist.source, dist.message) if broken else None,
        outside_yaml=MappingProxyType(dict(sec["outside_yaml"].get(s, ()))),
        dtype_limits=sec["dtype_limits"].get(s, ()),
        earlier_paths=MappingProxyType({p.op: p for p in sec["earlier_paths"].get(s, ()) if p.from_unit is None}),
        python_paths=tuple(p for p in sec["earlier_paths"].get(s, ()) if p.from_unit is not None),
        device_branches=facts.device_branches,
    )


def parse_torchvision(raw: dict) -> Mapping[OpKey, TorchvisionOp]:
    """Validate a loaded torchvision.yaml mapping: OpKey -> TorchvisionOp."""
    if raw.get("schema") != 1:
        raise ValueError(f"torchvision.yaml: unsupported schema {raw.get('schema')!r}")
    table: dict[OpKey, TorchvisionOp] = {}
    for entry in raw["ops"]:
        tv = TorchvisionOp(**entry_values(TorchvisionOp, entry, "torchvision.yaml", "op", since_torchvision=str,
                                          since_torch=str, op=lambda o: OpKey.from_yaml(o, namespace=raw["namespace"])))
        if tv.op in table or Release.parse(tv.since_torch).series != tv.since_torch:
            raise ValueError(f"torchvision.yaml: repeated op or bad since_torch in {entry!r}")
        table[tv.op] = tv
    return MappingProxyType(table)


def _read(path: str) -> dict:
    """yaml.safe_load a file into a mapping."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=_LOADER)  # noqa: S506 - _LOADER is yaml's (C)SafeLoader; the file is opscan's own
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


@functools.lru_cache(maxsize=4)
def load_facts(path: str = FACTS_PATH) -> Facts:
    """Load and validate facts.yaml (cached)."""
    return parse_facts(_read(path))


@functools.lru_cache(maxsize=4)
def load_torchvision(path: str = TORCHVISION_PATH) -> Mapping[OpKey, TorchvisionOp]:
    """Load and validate torchvision.yaml (cached)."""
    return parse_torchvision(_read(path))


def _series_key(release: str) -> tuple[int, int]:
    return Release.parse(release).series_key
