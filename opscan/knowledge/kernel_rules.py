"""Knowledge stage: the kernel checks opscan encodes (`kernel_rules.yaml`), each with a condition it decides.

kernel_checks.txt lists every runtime check of every release's MPS kernels (read from the binaries); this
module holds the ones whose failure condition opscan can decide from a traced call. Each rule of
kernel_rules.yaml names its check by message and source file, gives the C++ condition as read in the source
(`condition`, with `source` naming file, function and commit) and `when`: the same condition in the expression
language of conditions.py, over the op's arguments by their schema names (knowledge/signatures.txt, bound by
predict/bind.py) and `macos`; `patterns` encode a family of checks from their message. `size_rules` are the
checks decided from the call's pooled sizes instead (`input_spatial`, `output_size`), stated per release series because
their message and line moved between the releases' binaries. `fallbacks` are the CPU fallbacks inside MPS
kernels (a TORCH_WARN_ONCE "... Falling back on CPU", not a check): each names the releases whose binary holds
its message. `conditions.evaluate_when` decides them all (predict/runtime_checks.py applies them). No torch
import.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from opscan.knowledge.conditions import compile_when
from opscan.knowledge.schema import derived, entry_values
from opscan.opkey import OpKey, Release, ReleaseRange

RULES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_rules.yaml")
VERDICTS = ("error", "unsupported_dtype")


@dataclass(frozen=True)
class KernelRule:
    """One encoded kernel check."""

    id: str
    message: str  # the check's message in kernel_checks.txt (exact)
    file: str  # the source file's name (Convolution.mm)
    ops: tuple[str, ...]  # yaml spellings of the MPS-view ops it is evaluated for
    kind: str  # dtype | rank | size | flag | macos, joined with "+"
    condition: str  # the C++ failure condition as read
    when: str  # the same, in the expression language
    verdict: str  # error | unsupported_dtype
    remedy: str
    source: str  # where the condition was read
    code: ast.Expression = derived()
    first_tensor: bool = derived(default=False)  # a message pattern's rule: `self` is the call's first tensor argument


@dataclass(frozen=True)
class Pattern:
    """A family of checks encoded from their message (kernel_rules.yaml `patterns`)."""

    id: str
    match: re.Pattern
    kind: str
    when: str
    verdict: str
    remedy: str
    source: str
    code: ast.Expression = derived()

    def rule(self, check) -> KernelRule | None:
        """The rule encoding `check`, when its message matches and its kind includes this pattern's."""
        if not self.match.search(check.message.strip()) or self.kind not in check.kind.split("+"):
            return None
        condition = f"read from the message '{check.message.strip()}'"
        return KernelRule(self.id, check.message, check.file.rsplit("/", 1)[-1], check.ops, self.kind, condition,
                          self.when, self.verdict, self.remedy, self.source, self.code, True)


@dataclass(frozen=True)
class SizeRule:
    """A kernel check decided from the call's sizes (kernel_rules.yaml `size_rules`), for the series listed."""

    id: str
    ops: frozenset[OpKey]
    releases: ReleaseRange  # of release series ("2.14")
    message: str  # the kernel's message
    when: str  # over input_spatial and output_size
    remedy: str
    source: str
    code: ast.Expression = derived()


@dataclass(frozen=True)
class FallbackRule:
    """A CPU fallback inside an MPS kernel (kernel_rules.yaml `fallbacks`): for a call meeting `when`, the kernel
    itself runs the CPU op on copies of its inputs, whatever PYTORCH_ENABLE_MPS_FALLBACK says."""

    id: str
    message: str  # the kernel's TORCH_WARN_ONCE text, as in the releases' dylibs
    ops: tuple[str, ...]  # yaml spellings of the ops whose MPS kernel has it
    releases: ReleaseRange  # exact releases ("2.3.1") or series ("2.4": every patch release of it)
    condition: str  # the C++ condition as read
    when: str  # the same, in the expression language (over `args` and `macos`)
    remedy: str
    source: str
    code: ast.Expression = derived()
    first_tensor: bool = derived(default=False)  # as a KernelRule's (runtime_checks.bound_for)


@dataclass(frozen=True)
class KernelRules:
    """All of kernel_rules.yaml: the rules, the message patterns, the size rules and the in-kernel fallbacks."""

    rules: tuple[KernelRule, ...]
    patterns: tuple[Pattern, ...]
    size_rules: tuple[SizeRule, ...]
    fallbacks: tuple[FallbackRule, ...]


def _verdict(text: str) -> str:
    if text not in VERDICTS:
        raise ValueError(f"verdict {text!r} is not one of {VERDICTS}")
    return text


def _series(value) -> ReleaseRange:
    return ReleaseRange.parse(value, series=True)


_SECTIONS = {  # section -> (its entries' class, what an entry is called, how its values are read)
    "rules": (KernelRule, "rule", {"ops": tuple, "verdict": _verdict}),
    "patterns": (Pattern, "pattern", {"match": re.compile, "verdict": _verdict}),
    "size_rules": (SizeRule, "size rule", {"ops": lambda ops: frozenset(map(OpKey.from_yaml, ops)),
                                           "releases": _series}),
    "fallbacks": (FallbackRule, "fallback", {"ops": tuple, "releases": ReleaseRange.parse}),
}


def parse_kernel_rules(text: str) -> KernelRules:
    """kernel_rules.yaml text -> its entries, in order (ValueError on a bad or repeated entry)."""
    data = yaml.safe_load(text) or {}
    sections = {}
    for section, (cls, kind, read) in _SECTIONS.items():
        entries = []
        for raw in data.get(section, ()):
            values = entry_values(cls, raw, "kernel_rules.yaml", kind, **read)
            if any(e.id == values["id"] for e in entries):
                raise ValueError(f"kernel_rules.yaml: bad {kind} {values['id']!r} (repeated)")
            entries.append(cls(**values, code=compile_when(values["when"])))
        sections[section] = tuple(entries)
    return KernelRules(**sections)


@functools.lru_cache(maxsize=2)
def load_kernel_rules(path: str = RULES_PATH) -> KernelRules:
    """The shipped kernel_rules.yaml (read once)."""
    with open(path, encoding="utf-8") as fh:
        return parse_kernel_rules(fh.read())


def rules_encoding(check, rules: tuple[KernelRule, ...]) -> tuple[KernelRule, ...]:
    """The rules that encode a kernel check (same message, spaces aside, and same file): one per set of ops whose
    schemas name the arguments alike (dot's `tensor` is vdot's `other`)."""
    text = _plain(check.message)
    return tuple(r for r in rules if _plain(r.message) == text and check.file.endswith("/" + r.file))


def _plain(message: str) -> str:
    return " ".join(message.split())


@dataclass(frozen=True, eq=False)
class Limits:
    """The runtime checks of one release's MPS kernels, and the encoded ones among them."""

    release: str  # the release whose binary the checks were read from
    by_op: Mapping[str, tuple]  # yaml overload name -> KernelChecks its MPS kernel has
    encoded: tuple[tuple[KernelRule, object], ...]  # (rule, its KernelCheck in this release)
    total: int  # checks of the release
    rules_by_op: Mapping[str, tuple] = None  # yaml name -> its (rule, check) pairs (built by release_limits)

    def rules_for(self, yaml_name: str) -> tuple[tuple[KernelRule, object], ...]:
        """The encoded checks evaluated for an op."""
        return self.rules_by_op.get(yaml_name, ())

    def unmodelled(self, yaml_name: str) -> tuple:
        """The op's checks that no rule encodes."""
        ids = {c.id for _, c in self.encoded}
        return tuple(c for c in self.by_op.get(yaml_name, ()) if c.id not in ids)


def release_limits(release: str) -> Limits | None:
    """The Limits of `release` (the newest release read when it is newer than the file; None without it)."""
    from opscan.knowledge.kernel_checks import load_checks

    checks = load_checks()
    if checks is None or not checks.releases:
        return None
    read = release if release in checks.releases else None
    if read is None and Release.parse(release) > Release.parse(checks.releases[-1]):
        read = checks.releases[-1]
    if read is None:
        return None
    return _limits(checks, read)


@functools.lru_cache(maxsize=64)
def _limits(checks, release: str) -> Limits:
    """release_limits (cached)."""
    rules, patterns = load_kernel_rules().rules, load_kernel_rules().patterns
    encoded = []
    for check in checks.checks:
        if release not in check.releases:
            continue
        found = rules_encoding(check, rules) or next(((r,) for p in patterns if (r := p.rule(check))), ())
        encoded.extend((rule, check) for rule in found)
    by_op: dict[str, list] = {}
    for rule, check in encoded:
        for op in rule.ops:
            by_op.setdefault(op, []).append((rule, check))
    return Limits(release, checks.for_release(release), tuple(encoded), checks.count(release),
                  MappingProxyType({k: tuple(v) for k, v in by_op.items()}))
