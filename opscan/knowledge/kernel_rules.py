"""Knowledge stage: the kernel checks opscan encodes (`kernel_rules.yaml`), each with a condition it decides.

kernel_checks.txt lists every runtime check of every release's MPS kernels (read from the binaries); this
module holds the ones whose failure condition opscan can decide from a traced call. Each rule of
kernel_rules.yaml names its check by message and source file, gives the C++ condition as read in the source
(`condition`, with `source` naming file, function and commit), the schema names of the op's arguments
(`args`) and `when`: the same condition in the expression language of conditions.py (over those arguments
and `macos`); `patterns` encode a family of checks from their message. `size_rules` are the checks decided
from the call's pooled sizes instead (`input_spatial`, `output_size`), stated per release series because
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
    args: tuple[str, ...]  # the op's argument names, in schema order
    kind: str  # dtype | rank | size | flag | macos, joined with "+"
    condition: str  # the C++ failure condition as read
    when: str  # the same, in the expression language
    verdict: str  # error | unsupported_dtype
    remedy: str
    source: str  # where the condition was read
    code: ast.Expression
    first_tensor: bool = False  # a message pattern's rule: `self` is the call's first tensor argument


def parse_rules(text: str) -> tuple[KernelRule, ...]:
    """kernel_rules.yaml text -> rules (ValueError on a bad entry)."""
    data = yaml.safe_load(text) or {}
    rules, seen = [], set()
    for raw in data.get("rules", ()):
        missing = {"id", "message", "file", "ops", "args", "kind", "condition", "when", "verdict", "remedy",
                   "source"} - set(raw)
        if missing or raw["verdict"] not in VERDICTS or raw["id"] in seen:
            raise ValueError(f"kernel_rules.yaml: bad rule {raw.get('id')!r} (missing {sorted(missing)})")
        seen.add(raw["id"])
        rules.append(KernelRule(raw["id"], raw["message"], raw["file"], tuple(raw["ops"]), tuple(raw["args"]),
                                raw["kind"], raw["condition"], raw["when"], raw["verdict"], raw["remedy"],
                                raw["source"], compile_when(raw["when"])))
    return tuple(rules)


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
    code: ast.Expression

    def rule(self, check) -> KernelRule | None:
        """The rule encoding `check`, when its message matches and its kind includes this pattern's."""
        if not self.match.search(check.message.strip()) or self.kind not in check.kind.split("+"):
            return None
        condition = f"read from the message '{check.message.strip()}'"
        return KernelRule(self.id, check.message, check.file.rsplit("/", 1)[-1], check.ops, ("self",), self.kind,
                          condition, self.when, self.verdict, self.remedy, self.source, self.code, True)


def parse_patterns(text: str) -> tuple[Pattern, ...]:
    """kernel_rules.yaml text -> its message patterns (ValueError on a bad entry)."""
    out = []
    for raw in (yaml.safe_load(text) or {}).get("patterns", ()):
        if set(raw) != {"id", "match", "kind", "when", "verdict", "remedy", "source"} or raw["verdict"] not in VERDICTS:
            raise ValueError(f"kernel_rules.yaml: bad pattern {raw.get('id')!r}")
        out.append(Pattern(raw["id"], re.compile(raw["match"]), raw["kind"], raw["when"], raw["verdict"],
                           raw["remedy"], raw["source"], compile_when(raw["when"])))
    return tuple(out)


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
    code: ast.Expression


def parse_size_rules(text: str) -> tuple[SizeRule, ...]:
    """kernel_rules.yaml text -> its size rules, in order (ValueError on a bad entry)."""
    out = []
    for raw in (yaml.safe_load(text) or {}).get("size_rules", ()):
        if set(raw) != {"id", "ops", "releases", "message", "when", "remedy", "source"} or not raw["source"].strip():
            raise ValueError(f"kernel_rules.yaml: bad size rule {raw.get('id')!r}")
        try:
            series = ReleaseRange.parse(raw["releases"], series=True)
        except ValueError:
            raise ValueError(f"kernel_rules.yaml: size rule {raw['id']!r} lists a release that is not a series") \
                from None
        out.append(SizeRule(raw["id"], frozenset(OpKey.from_yaml(o) for o in raw["ops"]), series, raw["message"],
                            raw["when"], raw["remedy"], raw["source"], compile_when(raw["when"])))
    return tuple(out)


@dataclass(frozen=True)
class FallbackRule:
    """A CPU fallback inside an MPS kernel (kernel_rules.yaml `fallbacks`): for a call meeting `when`, the kernel
    itself runs the CPU op on copies of its inputs, whatever PYTORCH_ENABLE_MPS_FALLBACK says."""

    id: str
    message: str  # the kernel's TORCH_WARN_ONCE text, as in the releases' dylibs
    ops: tuple[str, ...]  # yaml spellings of the ops whose MPS kernel has it
    args: tuple[str, ...]  # the op's argument names, in schema order
    releases: ReleaseRange  # exact releases ("2.3.1") or series ("2.4": every patch release of it)
    condition: str  # the C++ condition as read
    when: str  # the same, in the expression language (over `args` and `macos`)
    remedy: str
    source: str
    code: ast.Expression
    first_tensor: bool = False  # read by CallArgs.bind, as a KernelRule's


_FALLBACK_KEYS = frozenset({"id", "message", "ops", "args", "releases", "condition", "when", "remedy", "source"})


def parse_fallbacks(text: str) -> tuple[FallbackRule, ...]:
    """kernel_rules.yaml text -> its in-kernel CPU fallbacks (ValueError on a bad entry)."""
    out = []
    for raw in (yaml.safe_load(text) or {}).get("fallbacks", ()):
        if set(raw) != _FALLBACK_KEYS or not raw["source"].strip() or not raw["releases"]:
            raise ValueError(f"kernel_rules.yaml: bad fallback {raw.get('id')!r}")
        try:
            releases = ReleaseRange.parse(raw["releases"])
        except ValueError:
            raise ValueError(f"kernel_rules.yaml: fallback {raw['id']!r} lists a release that is not one") from None
        out.append(FallbackRule(raw["id"], raw["message"], tuple(raw["ops"]), tuple(raw["args"]), releases,
                                raw["condition"], raw["when"], raw["remedy"], raw["source"],
                                compile_when(raw["when"])))
    return tuple(out)


@functools.lru_cache(maxsize=2)
def load_fallbacks(path: str = RULES_PATH) -> tuple[FallbackRule, ...]:
    """The shipped in-kernel CPU fallbacks."""
    with open(path, encoding="utf-8") as fh:
        return parse_fallbacks(fh.read())


@functools.lru_cache(maxsize=2)
def load_size_rules(path: str = RULES_PATH) -> tuple[SizeRule, ...]:
    """The shipped size rules."""
    with open(path, encoding="utf-8") as fh:
        return parse_size_rules(fh.read())


@functools.lru_cache(maxsize=2)
def load_rules(path: str = RULES_PATH) -> tuple[KernelRule, ...]:
    """The shipped rules."""
    with open(path, encoding="utf-8") as fh:
        return parse_rules(fh.read())


@functools.lru_cache(maxsize=2)
def load_patterns(path: str = RULES_PATH) -> tuple[Pattern, ...]:
    """The shipped message patterns."""
    with open(path, encoding="utf-8") as fh:
        return parse_patterns(fh.read())


def rule_for(check, rules: tuple[KernelRule, ...]) -> KernelRule | None:
    """The rule that encodes a kernel check (same message, spaces aside, and same file), or None."""
    text = _plain(check.message)
    return next((r for r in rules if _plain(r.message) == text and check.file.endswith("/" + r.file)), None)


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
    rules, patterns = load_rules(), load_patterns()
    encoded = []
    for check in checks.checks:
        if release not in check.releases:
            continue
        rule = rule_for(check, rules) or next((r for p in patterns if (r := p.rule(check))), None)
        if rule is not None:
            encoded.append((rule, check))
    by_op: dict[str, list] = {}
    for rule, check in encoded:
        for op in rule.ops:
            by_op.setdefault(op, []).append((rule, check))
    return Limits(release, checks.for_release(release), tuple(encoded), checks.count(release),
                  MappingProxyType({k: tuple(v) for k, v in by_op.items()}))
