"""Knowledge stage: assemble everything opscan knows about MPS support in one torch release, as one immutable
`Knowledge` (the package's face, opscan/knowledge/__init__.py, re-exports what callers use).

`load_knowledge(yaml_path=None, release=None, macos=None)` reads, without importing torch:

* the release's knowledge-base entry (`releases/`, entry.py): its overloads with MPS kernels and
  composite kinds, its Python registrations and its common_mps.py lists, read from that release's
  macOS wheel by tools/build_kb.py. The installed torch's own files are used instead ("built live")
  when the release is not in the knowledge base, or when its native_functions.yaml differs from the
  one the entry was built from; a given `yaml_path` replaces the overloads only ("custom");
* facts.yaml: the always-CPU list, error stubs, minimum macOS and the distributed rule, per release
  series (facts.py);
* torchvision.yaml (facts.py), opinfo_map.txt (opinfo.py), and the MPS kernels' runtime checks
  (kernel_checks.txt, kernel_checks.py) with the ones opscan decides (kernel_rules.yaml, kernel_rules.py);
* the known silent-correctness bugs that affect the release (silent_bugs.yaml, silent_bugs.py).

`release` defaults to the installed torch; `macos` (e.g. "15.0") to the release's minimum. Every
choice that is not plain is said in `notes` (the report's assumptions carry them).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from opscan.errors import OpscanError
from opscan.knowledge.build import YAML, installed_file, read_installed
from opscan.knowledge.common_mps import CommonMps, from_records
from opscan.knowledge.composite_callees import CALLEES_PATH
from opscan.knowledge.entry import load_store
from opscan.knowledge.kernel_checks import CHECKS_PATH
from opscan.knowledge.kernel_rules import RULES_PATH, Limits, release_limits
from opscan.knowledge.facts import (
    FACTS_PATH,
    TORCHVISION_PATH,
    Fact,
    Facts,
    ReleaseFacts,
    TorchvisionOp,
    load_facts,
    load_torchvision,
)
from opscan.knowledge.opinfo import MAP_PATH, OpinfoMap, load_opinfo_map
from opscan.knowledge.optable import OpTable
from opscan.knowledge.signatures import SIGNATURES_PATH
from opscan.knowledge.silent_bugs import BUGS_PATH, CHIPS
from opscan.knowledge.silent_bugs import bugs_for_release as silent_for
from opscan.knowledge.sources import yaml_records
from opscan.opkey import Macos, OpKey, Release, parse_macos


class KnowledgeError(OpscanError):
    """The knowledge base cannot be built: an unknown release, a missing yaml, a bad macOS version."""


@dataclass(frozen=True, eq=False)
class Knowledge:
    """The immutable knowledge base that `opscan.predict.rules.predict` reads."""

    release: str  # torch release predicted for, e.g. "2.14.1"
    yaml: OpTable
    yaml_release: str | None  # release whose wheel the overloads came from; None for a given path
    facts: ReleaseFacts = field(repr=False)
    all_facts: Facts = field(repr=False)
    torchvision: Mapping[OpKey, TorchvisionOp] = field(repr=False)
    common_mps: CommonMps | None = field(repr=False)  # None before 2.8 (no common_mps.py)
    installed_release: str | None = None
    kb_version: str = ""
    origin: str = "kb"  # "kb" (shipped entry), "live" (installed wheel's files) or "custom" (yaml_path)
    entry: str | None = None  # the shipped entry file, for origin "kb"
    macos: Macos = (14, 0)
    macos_source: str = ""
    notes: tuple[str, ...] = ()
    opinfo: OpinfoMap | None = field(default=None, repr=False)
    limits: Limits | None = field(default=None, repr=False)  # runtime checks of the MPS kernels (kernel_rules.py)
    chip: str | None = None  # the chip family the user named (--chip): "M1" .. "M5"; None: any Apple Silicon
    silent: Mapping = field(default_factory=dict, repr=False)  # op -> silent bugs of this release (silent_bugs.py)

    @property
    def yaml_source(self) -> str:
        """Where the overload facts come from, for Evidence.source."""
        if self.yaml_release is not None:
            return f"native_functions.yaml (torch {self.yaml_release} wheel)"
        return f"native_functions.yaml ({self.yaml.path})"

    def cia_with_mps(self) -> tuple[OpKey, ...]:
        """Overloads with both CompositeImplicitAutograd and an MPS kernel (see optable)."""
        return self.yaml.cia_with_mps()


@functools.lru_cache(maxsize=1)
def installed_release() -> str | None:
    """The installed torch's version without its local suffix ("2.14.1+cu130" -> "2.14.1"),
    read from the package metadata (torch is not imported); None when torch is not installed."""
    try:
        return Release.drop_local(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return None


def default_yaml_path() -> str:
    """native_functions.yaml inside the installed torchgen package (torch wheels ship it)."""
    path = installed_file(YAML)
    if path is None:
        raise KnowledgeError("native_functions.yaml not found in the installed torchgen package: install a "
                             "torch wheel or give the path of a native_functions.yaml")
    return path


def kb_releases() -> tuple[str, ...]:
    """Every release the shipped knowledge base covers, oldest first."""
    return load_store().releases()


def load_knowledge(yaml_path: str | None = None, release: str | None = None,
                   macos: str | None = None, chip: str | None = None) -> Knowledge:
    """Build the knowledge base for `release` (default: the installed torch) at `macos` (default: its
    minimum) on `chip` (a family, "M1".."M5"; default: any). Cached: equal arguments return the same object.
    Raises KnowledgeError when the release is unknown, a file is missing or the macOS version or chip is
    malformed."""
    import os

    return _load(os.path.abspath(yaml_path) if yaml_path else None,
                 Release.drop_local(release) if release else None, str(macos) if macos else None, chip or None)


@functools.lru_cache(maxsize=64)
def _load(yaml_path: str | None, release: str | None, macos: str | None, chip: str | None = None) -> Knowledge:
    """load_knowledge's cached body (arguments normalised)."""
    installed = installed_release()
    release = release or installed
    if not release:
        raise KnowledgeError("torch is not installed: install it, or name the release to predict for")
    _check_release(release)
    records, origin, entry, notes = _records(release, installed)
    table, yaml_release = _table(records, origin, entry, release, yaml_path)
    all_facts = load_facts()
    facts, fact_notes = _facts(all_facts, release, origin)
    wheel = f"torch {release} wheel" if origin != "live" else f"installed torch {release}"
    facts = _with_python_registrations(facts, records, wheel)
    assumed, macos_source = _macos(facts, macos)
    return Knowledge(
        release=release, yaml=table, yaml_release=yaml_release, facts=facts, all_facts=all_facts,
        torchvision=load_torchvision(), common_mps=from_records(records, f"common_mps.py ({wheel})"),
        installed_release=installed, kb_version=_version(table, yaml_release, all_facts, entry),
        origin="custom" if yaml_path else origin, entry=entry, macos=assumed, macos_source=macos_source,
        notes=tuple(notes + fact_notes + (["overloads from a given native_functions.yaml"] if yaml_path else [])),
        opinfo=load_opinfo_map(), limits=release_limits(release), chip=_chip(chip),
        silent=silent_for(release),
    )


def _chip(chip: str | None) -> str | None:
    """The chip family named ("M2", "m2", "Apple M2 Max" -> "M2"), checked (KnowledgeError for anything else)."""
    if chip is None:
        return None
    import re

    found = re.search(r"\bM(\d+)\b", chip.upper())
    if found is None or f"M{found.group(1)}" not in CHIPS:
        raise KnowledgeError(f"unknown chip family {chip!r}: give one of {', '.join(CHIPS)}")
    return f"M{found.group(1)}"


def _check_release(release: str) -> None:
    """KnowledgeError unless `release` looks like a torch release."""
    try:
        Release.parse(release)
    except ValueError as exc:
        raise KnowledgeError(f"{exc}: name a release such as 2.14.1") from None


def _records(release: str, installed: str | None) -> tuple[frozenset[str], str, str | None, list[str]]:
    """(records, origin, entry file, notes): the shipped entry's (all but `op`), or the installed wheel's."""
    store = load_store()
    line = store.line(release)
    if line is not None and not (release == installed and _installed_yaml_sha() != line.yaml_sha):
        return store.non_op_records(line.entry), "kb", line.entry, []  # the op records: _entry_table
    if release != installed:
        covered = store.releases()
        raise KnowledgeError(f"no knowledge-base entry for torch {release} (covered: {covered[0]} … "
                             f"{covered[-1]}): predict for a covered release, or install torch {release}")
    why = "is newer than the knowledge base" if line is None else "has a yaml unlike the shipped entry's"
    note = f"torch {release} {why}: its entry was built live from the installed wheel's files"
    return frozenset(read_installed().records()), "live", None, [note]


def _installed_yaml_sha() -> str:
    """First 12 hex digits of the installed native_functions.yaml's sha256."""
    with open(default_yaml_path(), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:12]


def _table(records, origin, entry, release, yaml_path) -> tuple[OpTable, str | None]:
    """The release's OpTable, or one read from `yaml_path`."""
    if yaml_path:
        try:
            with open(yaml_path, encoding="utf-8") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise KnowledgeError(f"native_functions.yaml not found at {yaml_path}: check the path") from None
        sha = hashlib.sha256(data.encode("utf-8")).hexdigest()
        return OpTable.from_records(yaml_records(data), yaml_path, sha), None
    if origin == "kb":
        return _entry_table(entry), release
    sha = hashlib.sha256(read_installed().yaml.encode()).hexdigest()
    return OpTable.from_records(records, "installed wheel", sha), release


@functools.lru_cache(maxsize=64)
def _entry_table(entry: str) -> OpTable:
    """The OpTable of a shipped entry (shared by the releases and macOS versions that use it)."""
    return OpTable(entry, _entry_sha(entry), load_store().op_fields(entry))


def _entry_sha(entry: str) -> str:
    """The native_functions.yaml sha256 an entry was built from."""
    return load_store().entry(entry).sha256().get("native_functions.yaml", "0" * 64)


def _facts(all_facts: Facts, release: str, origin: str) -> tuple[ReleaseFacts, list[str]]:
    """The hand-kept facts of the release's series; a live release newer than them gets the newest."""
    try:
        return all_facts.for_release(release), []
    except ValueError as exc:
        newest = all_facts.series[-1]
        if origin != "live" or Release.parse(release) < Release.parse(newest):
            raise KnowledgeError(f"{exc}: predict for one of those releases") from None
        note = (f"facts.yaml has no facts for torch {release}: the always-CPU list, error stubs and minimum "
                f"macOS of {newest} are assumed [INF]")
        return all_facts.for_release(newest), [note]


def _with_python_registrations(facts: ReleaseFacts, records, wheel: str) -> ReleaseFacts:
    """Replace facts.yaml's Python registrations by the release's own (parsed from its wheel)."""
    source = f"torch/backends/mps/__init__.py ({wheel}), parsed with ast; mps_facts.md §2"
    ops = sorted(OpKey.from_yaml(r[3:]) for r in records if r.startswith("py "))
    return dataclasses.replace(facts, python_registrations=MappingProxyType({op: Fact(source) for op in ops}))


def _macos(facts: ReleaseFacts, macos: str | None) -> tuple[Macos, str]:
    """(assumed macOS, where that assumption comes from)."""
    if macos is None:
        return parse_macos(facts.min_macos), f"the release's minimum: {facts.min_macos_source}"
    try:
        return parse_macos(macos), "--macos"
    except ValueError as exc:
        raise KnowledgeError(f"{exc}: give a version such as 14.0 or 15.2") from None


def _version(table: OpTable, yaml_release: str | None, all_facts: Facts, entry: str | None) -> str:
    """kb_version: the yaml digest, the facts count and a digest of every shipped data file."""
    h = hashlib.sha256()
    for path in (FACTS_PATH, TORCHVISION_PATH, MAP_PATH, CHECKS_PATH, RULES_PATH, BUGS_PATH, CALLEES_PATH,
                 SIGNATURES_PATH):
        try:
            with open(path, "rb") as fh:
                h.update(fh.read())
        except FileNotFoundError:
            h.update(b"-")
    h.update((entry or "-").encode())
    return f"yaml:{yaml_release or 'custom'}:{table.sha256[:12]}+facts:{all_facts.count}:{h.hexdigest()[:8]}"
