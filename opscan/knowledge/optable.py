"""Knowledge stage: one release's overloads, read from its knowledge-base `op` records.

`OpTable` answers what the classifier asks of native_functions.yaml (`get`, `mps_kernel`, `mps_counts`,
`cia_with_mps`, `overloads`, `path`, `sha256`) from the records sources.py writes, decoding an overload only
when asked, so loading a release costs a dict of short strings. Decoded `Overload.dispatch` holds only
the keys a record keeps (MPS, SparseMPS, SparseCsrMPS and the composite keys).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from opscan.knowledge.yaml_index import CEA, CEANF, CIA, MPS, SPARSE_CSR_MPS, SPARSE_MPS, Overload
from opscan.opkey import OpKey

_KEYS = {"M": MPS, "S": SPARSE_MPS, "C": SPARSE_CSR_MPS, "I": CIA, "E": CEA, "N": CEANF}


def op_fields(record: str) -> tuple[str, tuple[str, str | None]]:
    """`op NAME FLAGS [REF]` -> (NAME, (FLAGS, REF or None))."""
    _, name, flags, *ref = record.split(" ")
    return name, (flags, ref[0] if ref else None)


def decode(name: str, flags: str, ref: str | None) -> Overload:
    """One `op` record's fields -> Overload."""
    dispatch = frozenset(_KEYS[f] for f in flags if f in _KEYS)
    delegate = OpKey.from_yaml(ref[1:]) if ref and ref[0] == "<" else None
    origin = OpKey.from_yaml(ref[1:]) if ref and ref[0] == "^" else None
    return Overload(OpKey.from_yaml(name), dispatch, delegate, "i" in flags, origin)


class _Lazy(Mapping):
    """OpKey -> Overload over the table's raw fields, decoding on access."""

    def __init__(self, table: OpTable):
        self._table = table

    def __getitem__(self, op: OpKey) -> Overload:
        found = self._table.get(op)
        if found is None:
            raise KeyError(op)
        return found

    def __iter__(self) -> Iterator[OpKey]:
        return (OpKey.from_yaml(name) for name in self._table.raw)

    def __len__(self) -> int:
        return len(self._table.raw)


@dataclass(frozen=True, eq=False)
class OpTable:
    """The overloads of one release: yaml name -> (flags, ref)."""

    path: str  # where the records came from, for messages
    sha256: str  # sha256 of the native_functions.yaml they were read from
    raw: Mapping[str, tuple[str, str | None]] = field(repr=False)

    @classmethod
    def from_records(cls, records: Iterable[str], path: str, sha256: str) -> OpTable:
        """Build from `op NAME FLAGS [REF]` records (other kinds are skipped)."""
        return cls(path, sha256, dict(op_fields(r) for r in records if r.startswith("op ")))

    def get(self, op: OpKey) -> Overload | None:
        """The overload's entry, or None when the release does not declare it."""
        if op.namespace != "aten":
            return None
        return _decoded(self, op.yaml_name)

    def has(self, op: OpKey) -> bool:
        """Whether the release declares `op`."""
        return op.namespace == "aten" and op.yaml_name in self.raw

    @property
    def overloads(self) -> Mapping[OpKey, Overload]:
        """Every overload, decoded on access."""
        return _Lazy(self)

    def mps_kernel(self, op: OpKey) -> str | None:
        """"explicit" (its dispatch names MPS), "delegate" (its structured delegate's does) or None."""
        fields = self.raw.get(op.yaml_name) if op.namespace == "aten" else None
        return None if fields is None else self.kernel_of(op.yaml_name)

    def kernel_of(self, name: str) -> str | None:
        """mps_kernel by yaml name."""
        flags, ref = self.raw[name]
        if "M" in flags:
            return "explicit"
        if ref and ref[0] == "<" and "M" in self.raw.get(ref[1:], ("", None))[0]:
            return "delegate"
        return None

    def mps_counts(self) -> tuple[int, int]:
        """(explicit, inherited) MPS kernels."""
        kinds = [self.kernel_of(name) for name in self.raw]
        return kinds.count("explicit"), kinds.count("delegate")

    def cia_with_mps(self) -> tuple[OpKey, ...]:
        """Overloads whose dispatch names both CompositeImplicitAutograd and MPS, sorted."""
        both = (n for n, (flags, _) in self.raw.items() if "M" in flags and "I" in flags)
        return tuple(sorted(OpKey.from_yaml(n) for n in both))


def _decoded(table: OpTable, name: str) -> Overload | None:
    """Decode one overload (cached per table)."""
    cache = _cache(table)
    if name not in cache:
        fields = table.raw.get(name)
        cache[name] = None if fields is None else decode(name, *fields)
    return cache[name]


@functools.lru_cache(maxsize=64)
def _cache(table: OpTable) -> dict:
    """A per-table decode cache (tables are immutable and hashed by identity)."""
    return {}
