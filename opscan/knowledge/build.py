"""Knowledge stage: build one release's knowledge-base entry from a wheel's files.

Used by `tools/build_kb.py` (a downloaded macOS wheel), by `load_knowledge` for a torch newer than
the shipped entries (the installed wheel, built live) and by the test that rebuilds the installed
release's entry byte for byte. No torch import, no network: the files are read from a zip or from
the installed packages' folders.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import zipfile
from dataclasses import dataclass

from opscan.knowledge.entry import IndexLine, Store, format_entry
from opscan.opkey import Release
from opscan.knowledge.sources import git_version, release_records

# Paths inside a wheel (and, after the first "/", inside the installed torch / torchgen folders).
YAML = "torchgen/packaged/ATen/native/native_functions.yaml"
BACKENDS_MPS = "torch/backends/mps/__init__.py"
COMMON_MPS = "torch/testing/_internal/common_mps.py"
VERSION = "torch/version.py"
_SHA_NAMES = ((YAML, "native_functions.yaml"), (BACKENDS_MPS, "backends/mps/__init__.py"),
              (COMMON_MPS, "common_mps.py"))


@dataclass(frozen=True)
class WheelFiles:
    """The texts opscan reads from one torch wheel (common_mps.py is absent before 2.8)."""

    yaml: str
    backends_mps: str
    common_mps: str | None
    version: str

    def text(self, path: str) -> str | None:
        """The text of one of the four wheel paths."""
        return {YAML: self.yaml, BACKENDS_MPS: self.backends_mps, COMMON_MPS: self.common_mps,
                VERSION: self.version}[path]

    def sha256(self, path: str) -> str | None:
        """Hex sha256 of a file's bytes (None when absent)."""
        text = self.text(path)
        return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()

    def meta(self) -> dict[str, str]:
        """The entry header values that come from the files themselves."""
        meta = {"git_version": git_version(self.version) or "-"}
        for path, name in _SHA_NAMES:
            digest = self.sha256(path)
            if digest:
                meta[f"sha256 {name}"] = digest
        return meta

    def records(self) -> list[str]:
        """The release's records (sources.py)."""
        return release_records(self.yaml, self.backends_mps, self.common_mps)


def read_wheel(path: str) -> WheelFiles:
    """The files of a wheel (a zip); KeyError when a required one is missing."""
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())

        def read(name: str) -> str | None:
            """A member's text, or None when the wheel lacks it."""
            return zf.read(name).decode("utf-8") if name in names else None

        files = {p: read(p) for p in (YAML, BACKENDS_MPS, COMMON_MPS, VERSION)}
    missing = [p for p in (YAML, BACKENDS_MPS, VERSION) if files[p] is None]
    if missing:
        raise KeyError(f"{path}: missing {', '.join(missing)}")
    return WheelFiles(files[YAML], files[BACKENDS_MPS], files[COMMON_MPS], files[VERSION])


def installed_file(path: str) -> str | None:
    """Where a wheel path lives in the installed packages (torch is not imported), or None."""
    package, _, rest = path.partition("/")
    spec = importlib.util.find_spec(package)
    for root in (spec and spec.submodule_search_locations) or ():
        candidate = os.path.join(root, *rest.split("/"))
        if os.path.isfile(candidate):
            return candidate
    return None


def read_installed() -> WheelFiles:
    """The same files from the installed torch (Linux wheels ship them byte-identical)."""
    def read(path: str) -> str | None:
        """An installed file's text, or None when absent."""
        found = installed_file(path)
        if found is None:
            return None
        with open(found, encoding="utf-8", newline="") as fh:
            return fh.read()

    texts = {p: read(p) for p in (YAML, BACKENDS_MPS, COMMON_MPS, VERSION)}
    missing = [p for p in (YAML, BACKENDS_MPS, VERSION) if texts[p] is None]
    if missing:
        raise FileNotFoundError(f"the installed torch lacks {', '.join(missing)}")
    return WheelFiles(texts[YAML], texts[BACKENDS_MPS], texts[COMMON_MPS], texts[VERSION])


def base_for(release: str, store: Store) -> str | None:
    """The newest release older than `release` that has an entry file of its own."""
    own = [line.release for line in store.index
           if line.entry == store.entry_name(line.release) and Release.parse(line.release) < Release.parse(release)]
    return max(own, key=Release.parse) if own else None


def same_series_twin(release: str, records: frozenset[str], store: Store) -> str | None:
    """Another release of the same series whose own entry has exactly these records, or None."""
    series = Release.parse(release).series
    for line in store.index:
        own = line.entry == store.entry_name(line.release)
        if own and line.release != release and Release.parse(line.release).series == series:
            if store.records(line.entry) == records:
                return line.entry
    return None


@dataclass(frozen=True)
class EntryPlan:
    """What building one release writes: an entry file (or none, when it shares one) and its index line."""

    entry_name: str
    entry_text: str | None  # None: the release shares an existing entry
    index_line: IndexLine


def plan_entry(release: str, files: WheelFiles, store: Store, wheel: str = "-", wheel_sha256: str = "-") -> EntryPlan:
    """Decide and render the entry of `release` from its files, against the shipped `store`."""
    records = frozenset(files.records())
    yaml_sha = (files.sha256(YAML) or "")[:12]
    twin = same_series_twin(release, records, store)
    if twin is not None:
        return EntryPlan(twin, None, IndexLine(release, twin, yaml_sha, wheel, wheel_sha256))
    base = base_for(release, store)
    base_records = store.records(store.entry_name(base)) if base else frozenset()
    text = format_entry(release, base, files.meta(), records, base_records)
    name = store.entry_name(release)
    return EntryPlan(name, text, IndexLine(release, name, yaml_sha, wheel, wheel_sha256))
