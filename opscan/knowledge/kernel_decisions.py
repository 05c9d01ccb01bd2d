"""Knowledge stage: every runtime check of kernel_checks.txt decided — encoded, or not encoded and why (issue 38).

A check is `encoded` when kernel_rules.yaml holds a rule for it (or a message pattern matches it) and it belongs to
an op; otherwise it is decided not to be encoded, with a reason of kernel_decisions.yaml: a per-check decision
(`checks`, by id, with a note), else the first class (`classes`, in order) that matches it — by its message (a
regex), its kind, its VIA, its source file, or by having a CPU twin (the same message at a check of non-MPS code in
the same release's dylib: kernel_cpu_twins.txt, tools/kernel_decisions.py). A check none of them decides is
`undecided`; tests/test_kernel_decisions.py holds that count at 0, and docs/knowledge-base.md's table at what
`decision_table()` prints. No torch import.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from opscan.knowledge.schema import entry_values

_HERE = os.path.dirname(os.path.abspath(__file__))
DECISIONS_PATH = os.path.join(_HERE, "kernel_decisions.yaml")
TWINS_PATH = os.path.join(_HERE, "kernel_cpu_twins.txt")
ENCODED = "encoded"
UNDECIDED = "undecided"


@dataclass(frozen=True)
class CheckDecision:
    """What opscan does with one kernel check: `encoded` (by `rule`), a reason id, or `undecided`."""

    status: str  # ENCODED | a reason id of kernel_decisions.yaml | UNDECIDED
    text: str  # the rule that encodes it, or the reason's text (and the check's note)


@dataclass(frozen=True)
class _Class:
    """A class of checks decided alike (kernel_decisions.yaml `classes`; its keys are these fields)."""

    reason: str
    match: re.Pattern | None = None
    kinds: frozenset[str] = frozenset()
    via: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()
    twin: bool = False
    note: str = ""


@dataclass(frozen=True)
class Decisions:
    """kernel_decisions.yaml, parsed."""

    reasons: Mapping[str, str]
    classes: tuple[_Class, ...]
    checks: Mapping[str, tuple[str, str]]  # id -> (reason, note)


def parse_decisions(text: str) -> Decisions:
    """kernel_decisions.yaml text -> Decisions (ValueError on an unknown reason or key)."""
    data = yaml.safe_load(text) or {}
    reasons = {str(k): str(v) for k, v in (data.get("reasons") or {}).items()}
    classes = []
    names = lambda v: frozenset(v or ())  # noqa: E731
    for raw in data.get("classes") or ():
        found = _Class(**entry_values(_Class, raw, "kernel_decisions.yaml", "class", kinds=names, via=names,
                                      files=names, twin=bool, note=str,
                                      match=lambda m: re.compile(m) if m else None))
        if found.reason not in reasons:
            raise ValueError(f"kernel_decisions.yaml: bad class {raw!r} (unknown reason)")
        classes.append(found)
    checks = {}
    for cid, raw in (data.get("checks") or {}).items():
        if not isinstance(raw, dict) or raw.get("reason") not in reasons or not str(raw.get("note", "")).strip():
            raise ValueError(f"kernel_decisions.yaml: check {cid!r} needs a known reason and a note")
        checks[str(cid)] = (raw["reason"], str(raw["note"]))
    return Decisions(reasons, tuple(classes), checks)


def parse_twins(text: str) -> dict[str, str]:
    """kernel_cpu_twins.txt text -> check id -> the non-MPS source files whose checks have the same message."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            cid, files = line.split("\t", 1)
            out[cid] = files
    return out


@functools.lru_cache(maxsize=2)
def load_decisions(path: str = DECISIONS_PATH) -> Decisions:
    """The shipped decisions."""
    with open(path, encoding="utf-8") as fh:
        return parse_decisions(fh.read())


@functools.lru_cache(maxsize=2)
def load_twins(path: str = TWINS_PATH) -> dict[str, str]:
    """The shipped CPU twins ({} when the file is absent)."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return parse_twins(fh.read())


def _matches(cls: _Class, check, twins: Mapping[str, str]) -> bool:
    if cls.twin and check.id not in twins:
        return False
    if cls.match is not None and not cls.match.search(check.message):
        return False
    if cls.kinds and not cls.kinds & set(check.kind.split("+")):
        return False
    if cls.via and check.via not in cls.via:
        return False
    return not cls.files or check.file.rsplit("/", 1)[-1] in cls.files


def decide_check(check, encoding, decisions: Decisions, twins: Mapping[str, str]) -> CheckDecision:
    """One check's decision; `encoding` is the KernelRule that encodes it (None: none does)."""
    if encoding is not None and check.ops:
        return CheckDecision(ENCODED, f"kernel_rules.yaml {encoding.id}")
    if check.id in decisions.checks:
        reason, note = decisions.checks[check.id]
        return CheckDecision(reason, f"{decisions.reasons[reason]} — {note}")
    for cls in decisions.classes:
        if _matches(cls, check, twins):
            extra = f" (CPU twin: {twins[check.id]})" if cls.twin else (f" — {cls.note}" if cls.note else "")
            return CheckDecision(cls.reason, decisions.reasons[cls.reason] + extra)
    return CheckDecision(UNDECIDED, "no rule encodes it and kernel_decisions.yaml gives no reason")


def decide_all() -> dict[str, tuple[object, CheckDecision]]:
    """Check id -> (KernelCheck, CheckDecision) for every check of kernel_checks.txt."""
    from opscan.knowledge.kernel_checks import load_checks
    from opscan.knowledge.kernel_rules import load_kernel_rules, rules_encoding

    shipped = load_kernel_rules()
    rules, patterns = shipped.rules, shipped.patterns
    decisions, twins = load_decisions(), load_twins()
    out = {}
    for check in load_checks().checks:
        encoding = next(iter(rules_encoding(check, rules)), None) or next((r for p in patterns if (r := p.rule(check))),
                                                                          None)
        out[check.id] = (check, decide_check(check, encoding, decisions, twins))
    return out


def decision_table() -> str:
    """The markdown table of docs/knowledge-base.md: checks per kind, encoded, each reason, undecided."""
    decided = decide_all()
    reasons = list(load_decisions().reasons)
    by_kind: dict[str, Counter] = {}
    for check, decision in decided.values():
        by_kind.setdefault(check.kind, Counter())[decision.status] += 1
    columns = [ENCODED, *reasons, UNDECIDED]
    lines = ["| kind | checks | " + " | ".join(f"`{c}`" for c in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    total = Counter()
    for kind in sorted(by_kind, key=lambda k: (-sum(by_kind[k].values()), k)):
        counts = by_kind[kind]
        total.update(counts)
        lines.append(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in columns) + " |")
    lines.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(f"**{total[c]}**" for c in columns)
                 + " |")
    return "\n".join(lines) + "\n"
