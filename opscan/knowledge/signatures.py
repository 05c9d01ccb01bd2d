"""Knowledge base: signatures.txt, the arguments of every aten overload's schema in each covered release, as its
native_functions.yaml `func:` names them — the names every condition of the knowledge files reads (kernel_rules.yaml,
silent_bugs.yaml, composite_paths.yaml), bound to a call's arguments by predict/bind.py.

Written by tools/build_signatures.py from each covered release's macOS wheel. Lines:

    # comments, then `releases R1 R2 ...` (every covered release, oldest first), then one row per op and group
    # of releases whose schemas name the same arguments:
    OP RELEASES ARG ...        RELEASES: `2.0.0..2.4.1,2.6.0` (runs of covered releases); ARG: `name`, or
                               `name=default` as the schema spells the default; `-`: no argument

An overload `autogen:` generates has no `func:` and no row. No torch import.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

from opscan.knowledge.table_text import format_by_release, parse_by_release, read_shipped
from opscan.opkey import Release

# MPS-view ops that stand for another recorded call, whose arguments a condition on them reads: the device branches
# of mps_view.py (rule mps-convolution) and the lens's groups (trace/lens.py BRANCHES: the high-level call it
# recorded); tests/test_bind.py holds it to both
RECORDED_AS = {
    "_mps_convolution": "convolution", "_mps_convolution_transpose": "convolution",
    "mps_convolution_backward": "convolution_backward", "mps_convolution_transpose_backward": "convolution_backward",
    "linear": "linear", "max_pool2d": "max_pool2d", "_fused_rms_norm": "rms_norm",
    "_scaled_dot_product_attention_math_for_mps": "scaled_dot_product_attention", "_lstm_mps": "lstm.input",
}
RESULT = "result"
SIGNATURES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signatures.txt")
_NONE = "-"
NO_DEFAULT = object()  # Argument.value() of a required argument, or of a default that is not a literal
_ENUMS = {"Mean": 1, "Sum": 2}  # at::Reduction, the one enum schema defaults name (int reduction=Mean)


@dataclass(frozen=True)
class Argument:
    """One argument of a schema: its name and its default as the schema spells it (None: required)."""

    name: str
    default: str | None = None

    def value(self):
        """The default as a Python value (None, a bool, a number, a list, a string, a reduction's int), or
        NO_DEFAULT (required, or a default such as `contiguous_format` that is no literal)."""
        return NO_DEFAULT if self.default is None else _literal(self.default)

    def __str__(self) -> str:
        return self.name if self.default is None else f"{self.name}={self.default}"


@dataclass(frozen=True, eq=False)
class Signatures:
    """signatures.txt: release -> op (yaml name) -> its arguments."""

    releases: tuple[str, ...]
    by_release: Mapping[str, Mapping[str, tuple[Argument, ...]]]

    def arguments(self, op: str, release: str) -> tuple[Argument, ...] | None:
        """The arguments of overload `op` in `release` (a release newer than the table: its newest one's); None
        when the release does not declare it, or one older than the table."""
        if release not in self.by_release and self.releases and Release.parse(release) > Release.parse(
                self.releases[-1]):
            release = self.releases[-1]
        return self.by_release.get(release, {}).get(op)


def names_for(op: str, release: str) -> frozenset[str] | None:
    """The names a condition on MPS-view op `op` may read in `release` (predict/bind.py binds them): its recorded
    op's arguments, `self` for a recorded `input`, and `result`; None when the table lacks the op there."""
    table = load_signatures()
    schema = table.arguments(RECORDED_AS.get(op, op), release) if table is not None else None
    if schema is None:
        return None
    names = {a.name for a in schema}
    return frozenset(names | {RESULT} | ({"self"} if "input" in names else set()))


def format_signatures(releases: list[str], per_release: Mapping[str, Mapping[str, tuple[Argument, ...]]],
                      header: str) -> str:
    """The text of signatures.txt (`header`: its comment lines, each starting with '#')."""
    return format_by_release(releases, per_release,
                             lambda op, runs, arguments: f"{op} {runs} {' '.join(map(str, arguments)) or _NONE}",
                             header)


def parse_signatures(text: str) -> Signatures:
    """Signatures of signatures.txt's text; ValueError on a malformed line."""
    return Signatures(*parse_by_release(text, "signatures.txt", 1, _arguments))


def _arguments(fields: list[str], where: str) -> tuple[Argument, ...]:
    return () if fields[2:] == [_NONE] else tuple(Argument(*_split(f)) for f in fields[2:])


@functools.lru_cache(maxsize=None)
def _literal(default: str):
    """A schema default's Python value, or NO_DEFAULT (read once per spelling: calls ask it for every argument)."""
    if default in _ENUMS:
        return _ENUMS[default]
    try:
        value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return NO_DEFAULT
    return tuple(value) if isinstance(value, list) else value


def _split(field: str) -> tuple[str, str | None]:
    name, eq, default = field.partition("=")
    return (name, default) if eq else (name, None)


@functools.lru_cache(maxsize=2)
def load_signatures(path: str = SIGNATURES_PATH) -> Signatures | None:
    """The shipped table (cached); None when the file is absent."""
    return read_shipped(path, parse_signatures)
