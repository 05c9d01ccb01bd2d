"""Knowledge base: composite_callees.txt, which aten ops each release's C++ composite kernels call.

Written by tools/build_composite_callees.py from the libtorch_cpu.dylib of every covered release's macOS arm64
wheel: for every composite overload (CompositeImplicitAutograd, CompositeExplicitAutograd(NonFunctional), and the
autogen out= overloads torchgen writes a kernel for), the ops its kernel can dispatch — any branch, helpers
followed DEPTH levels deep: a static over-approximation of what it runs, read from the binary. Lines:

    # comments, then `releases R1 R2 ...` (every release the table covers, oldest first), then one row per op and
    # group of releases whose kernels call the same ops:
    OP KEY RELEASES CALLEE ...        KEY: CIA | CEA | CEANF; RELEASES: `2.0.0..2.2.2,2.5.0` (ranges over the
                                      covered releases); CALLEE: yaml names, `-` for none, `?` when no kernel
                                      body was found (the autogen out= of a CIA op)

A release that does not list OP does not have it as a composite (not declared, or a kernel of its own).
No torch import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

from opscan.knowledge.table_text import format_by_release, parse_by_release, read_shipped

CALLEES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "composite_callees.txt")
KIND_KEYS = {"CompositeImplicitAutograd": "CIA", "CompositeExplicitAutograd": "CEA",
        "CompositeExplicitAutogradNonFunctional": "CEANF"}
UNKNOWN, NONE = "?", "-"
CALLEES_SOURCE = ("opscan/knowledge/composite_callees.txt (tools/build_composite_callees.py: the composite kernel's "
                  "calls read from torch {release}'s macOS arm64 libtorch_cpu.dylib) [bin]")


@dataclass(frozen=True)
class Kernel:
    """What one composite overload's kernel calls in one release."""

    key: str  # CIA | CEA | CEANF
    callees: frozenset[str] | None  # yaml names; None: no body found, not known


@dataclass(frozen=True, eq=False)
class CalleeTable:
    """composite_callees.txt: release -> op (yaml name) -> Kernel."""

    releases: tuple[str, ...]
    kernels: Mapping[str, Mapping[str, Kernel]]

    def kernel(self, op: str, release: str) -> Kernel | None:
        """The composite kernel of `op` in `release` (None: not a composite there, or a release not covered)."""
        return self.kernels.get(release, {}).get(op)

    def covers(self, release: str) -> bool:
        """Whether the table was built from `release`'s wheel."""
        return release in self.kernels

    def drifted(self) -> frozenset[str]:
        """The ops whose callee set differs between two releases where both are composites."""
        seen: dict[str, set] = {}
        for table in self.kernels.values():
            for op, k in table.items():
                seen.setdefault(op, set()).add(k.callees)
        return frozenset(op for op, sets in seen.items() if len(sets) > 1)


def format_table(releases: list[str], per_release: Mapping[str, Mapping[str, Kernel]], header: str) -> str:
    """The text of composite_callees.txt (`header`: its comment lines, each starting with '#')."""
    def row(op: str, runs: str, kernel: Kernel) -> str:
        callees = UNKNOWN if kernel.callees is None else " ".join(sorted(kernel.callees)) or NONE
        return f"{op} {kernel.key} {runs} {callees}"
    return format_by_release(releases, per_release, row, header)


def parse_table(text: str) -> CalleeTable:
    """CalleeTable of composite_callees.txt's text; ValueError on a malformed line."""
    return CalleeTable(*parse_by_release(text, "composite_callees.txt", 2, _kernel))


def _kernel(fields: list[str], where: str) -> Kernel:
    if fields[1] not in KIND_KEYS.values():
        raise ValueError(f"{where}: malformed: {' '.join(fields)!r}")
    return Kernel(fields[1], None if fields[3:] == [UNKNOWN] else frozenset(c for c in fields[3:] if c != NONE))


@functools.lru_cache(maxsize=2)
def load_callees(path: str = CALLEES_PATH) -> CalleeTable | None:
    """The shipped table (cached); None when the file is absent."""
    return read_shipped(path, parse_table)
