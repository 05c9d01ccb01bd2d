"""Knowledge stage: the shipped knowledge base, one plain-text entry per torch release.

Layout of `opscan/knowledge/releases/`:

* `index.txt`: one line per covered release: `RELEASE ENTRY yaml=SHA12 WHEEL WHEEL_SHA256`: the
  entry file holding its records, the first 12 hex digits of the sha256 of its
  native_functions.yaml, and the macOS arm64 wheel it was read from. Several releases share an
  entry when their records are equal (a patch release whose yaml only renamed a kernel).
* `<release>.txt`: a header of `key value` lines (`release`, `base`, `git_version`, `sha256 FILE
  HEX`, `counts ...`), then the records (grammar in sources.py) that differ from the `base`
  entry's: `+record` added, `-record` removed, sorted by record. The first entry has `base -` and
  lists everything. So `diff`-ing two releases is reading one file, and a new release is one small
  file and one index line.

Nothing here imports torch. Materialised record sets are cached per entry.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from opscan.opkey import Release

RELEASES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "releases")
INDEX_NAME = "index.txt"
HEADER_KEYS = ("release", "base", "git_version", "sha256", "counts")


@dataclass(frozen=True)
class IndexLine:
    """One release of index.txt."""

    release: str
    entry: str  # file name under releases/
    yaml_sha: str  # first 12 hex digits of its native_functions.yaml's sha256
    wheel: str
    wheel_sha256: str

    def text(self) -> str:
        """The line as written to index.txt."""
        return f"{self.release} {self.entry} yaml={self.yaml_sha} {self.wheel} {self.wheel_sha256}"


@dataclass(frozen=True)
class Entry:
    """One parsed entry file: its header and its delta against `base`."""

    release: str
    base: str | None
    header: tuple[tuple[str, str], ...]
    added: frozenset[str]
    removed: frozenset[str]

    def value(self, key: str) -> str | None:
        """The first header value for `key` ("sha256" values are "FILE HEX")."""
        return next((v for k, v in self.header if k == key), None)

    def sha256(self) -> dict[str, str]:
        """{file: hex} from the `sha256` header lines."""
        return dict(v.split(" ", 1) for k, v in self.header if k == "sha256")


def parse_index(text: str) -> tuple[IndexLine, ...]:
    """index.txt -> its lines, in release order."""
    lines = []
    for raw in text.splitlines():
        if raw.strip() and not raw.startswith("#"):
            release, entry, yaml_sha, wheel, digest = raw.split()
            lines.append(IndexLine(release, entry, yaml_sha.removeprefix("yaml="), wheel, digest))
    return tuple(sorted(lines, key=lambda line: Release.parse(line.release)))


def format_index(lines: Iterable[IndexLine]) -> str:
    """index.txt text for `lines` (sorted by release)."""
    head = ("# opscan knowledge base: every covered torch release, the entry file holding its records, the\n"
            "# sha256 prefix of its native_functions.yaml, and the macOS arm64 wheel (with sha256) it was read\n"
            "# from. Written by tools/build_kb.py; see opscan/knowledge/entry.py.\n")
    ordered = sorted(lines, key=lambda line: Release.parse(line.release))
    return head + "".join(line.text() + "\n" for line in ordered)


def parse_entry(text: str) -> Entry:
    """An entry file's text -> Entry (ValueError on a malformed line)."""
    header, added, removed = [], set(), set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        if line[0] in "+-":
            (added if line[0] == "+" else removed).add(line[1:])
            continue
        key, _, value = line.partition(" ")
        if key not in HEADER_KEYS or added or removed:
            raise ValueError(f"entry line {number}: unexpected {line!r}")
        header.append((key, value))
    values = dict(header)
    if "release" not in values or "base" not in values:
        raise ValueError("entry: `release` and `base` header lines are required")
    base = None if values["base"] == "-" else values["base"]
    return Entry(values["release"], base, tuple(header), frozenset(added), frozenset(removed))


def counts_line(records: Iterable[str]) -> str:
    """The `counts` header value: how many records of each kind, MPS kernels split explicit+delegate."""
    records = list(records)
    kinds = Counter(r.split(" ", 1)[0] for r in records)
    flags = {r.split(" ")[1]: r.split(" ") for r in records if r.startswith("op ")}
    explicit = sum("M" in f[2] for f in flags.values())
    delegate = sum("M" not in f[2] and len(f) > 3 and f[3].startswith("<")
                   and "M" in flags.get(f[3][1:], ("", "", ""))[2] for f in flags.values())
    parts = [f"op={kinds['op']}", f"mps={explicit}+{delegate}", f"py={kinds['py']}",
             f"complex={kinds['complex']}", f"xfail={kinds['xfail']}"]
    return " ".join(parts)


def format_entry(release: str, base: str | None, meta: Mapping[str, str], records: Iterable[str],
                 base_records: Iterable[str] = ()) -> str:
    """The text of an entry holding `records`, delta-encoded against `base_records`.

    `meta`: `git_version` and `sha256 FILE` values ({"git_version": ..., "sha256 x.yaml": hex})."""
    new, old = set(records), set(base_records)
    lines = [f"# opscan knowledge base entry: torch {release}"
             + (f" (records added and removed against {base})" if base else " (every record)"),
             "# written by tools/build_kb.py from the release's macOS arm64 wheel; see opscan/knowledge/entry.py",
             f"release {release}", f"base {base or '-'}"]
    lines += [f"{key} {value}" for key, value in meta.items()]
    lines.append(f"counts {counts_line(new)}")
    delta = [(r, "-") for r in old - new] + [(r, "+") for r in new - old]
    lines += [sign + record for record, sign in sorted(delta)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, eq=False)
class Store:
    """The entries of one releases/ folder."""

    folder: str
    index: tuple[IndexLine, ...]

    def line(self, release: str) -> IndexLine | None:
        """The index line of `release` (local suffix ignored), or None."""
        plain = Release.drop_local(release)
        return next((line for line in self.index if line.release == plain), None)

    def releases(self) -> tuple[str, ...]:
        """Every covered release, oldest first."""
        return tuple(line.release for line in self.index)

    def entry(self, name: str) -> Entry:
        """The parsed entry file `name`."""
        return _read_entry(os.path.join(self.folder, name))

    def records(self, name: str) -> frozenset[str]:
        """The full record set of entry file `name` (its base chain applied)."""
        return _materialise(self.folder, name)

    def non_op_records(self, name: str) -> frozenset[str]:
        """The records of entry file `name` other than `op` ones (`py`, `complex`, `xfail`)."""
        return _non_op(self.folder, name)

    def op_fields(self, name: str) -> Mapping[str, tuple[str, str | None]]:
        """The `op` records of entry file `name` as {yaml name: (flags, ref)} (optable.py)."""
        return _op_fields(self.folder, name)

    def entry_name(self, release: str) -> str:
        """The entry file name of a release built as its own entry."""
        return f"{release}.txt"


@functools.lru_cache(maxsize=64)
def _read_entry(path: str) -> Entry:
    """Parse one entry file (cached)."""
    with open(path, encoding="utf-8") as fh:
        return parse_entry(fh.read())


@functools.lru_cache(maxsize=64)
def _materialise(folder: str, name: str) -> frozenset[str]:
    """Apply an entry's chain of deltas; ValueError when a delta does not fit its base."""
    entry = _read_entry(os.path.join(folder, name))
    base = _materialise(folder, f"{entry.base}.txt") if entry.base else frozenset()
    if not entry.removed <= base or entry.added & base:
        raise ValueError(f"{name}: its delta does not apply to entry {entry.base}")
    return (base - entry.removed) | entry.added


@functools.lru_cache(maxsize=64)
def _non_op(folder: str, name: str) -> frozenset[str]:
    """Store.non_op_records (cached)."""
    return frozenset(r for r in _materialise(folder, name) if not r.startswith("op "))


@functools.lru_cache(maxsize=64)
def _op_fields(folder: str, name: str) -> Mapping[str, tuple[str, str | None]]:
    """An entry's `op` records as a dict, built from its base's dict and its delta (cheaper than
    re-parsing the whole record set of every release)."""
    from opscan.knowledge.optable import op_fields

    entry = _read_entry(os.path.join(folder, name))
    fields = dict(_op_fields(folder, f"{entry.base}.txt")) if entry.base else {}
    for record in entry.removed:
        if record.startswith("op "):
            fields.pop(op_fields(record)[0])
    fields.update(op_fields(r) for r in entry.added if r.startswith("op "))
    return MappingProxyType(fields)


@functools.lru_cache(maxsize=4)
def load_store(folder: str = RELEASES_DIR) -> Store:
    """The knowledge base under `folder` (cached)."""
    with open(os.path.join(folder, INDEX_NAME), encoding="utf-8") as fh:
        return Store(folder, parse_index(fh.read()))
