"""Predict stage: a release's whole knowledge base as rows, one per aten overload (`opscan coverage`).

Each row has a `status` (the verdict `predict.rules.predict_op` gives the overload without dtypes), a
`kernel` (what serves it on MPS: `mps` an MPS kernel in native_functions.yaml, own or via its
structured delegate, or registered by hand; `composite` a composite kernel running other ops;
`python` a Python registration; `cpu_fallback` the always-CPU list; `none`), `since` (the first
covered release where its status is native), the evidence and `limits`: the runtime checks of its MPS
kernel in that release (kernel_checks.txt), each marked encoded or not. A composite gets the status of
what it calls (predict/composite.py: an `autogen:` overload calls the overload it was generated from; the
others the callees recorded on OpInfo samples at build time, judged release by release), else `unknown`
with the reason. `diff` compares two releases: kernel changes and status changes are listed apart (a
kernel that became a composite may keep its status). No torch import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from opscan.knowledge import Knowledge, load_knowledge
from opscan.predict.rules import judge_composite
from opscan.opkey import OpKey, macos_text
from opscan.verdict import Classification, Evidence, Verdict
from opscan.trust.text import strict_json

KERNELS = ("mps", "composite", "python", "cpu_fallback", "none")


@dataclass(frozen=True)
class CoverageRow:
    """One overload of a release."""

    op: OpKey
    status: Verdict
    kernel: str
    since: str | None
    evidence: Evidence
    limits: tuple[dict, ...] = ()  # the runtime checks of its MPS kernel (see limits_of)

    def to_dict(self) -> dict:
        """JSON form (`op`/`overload` as in the report contract)."""
        return {"op": self.op.op, "overload": self.op.overload, "status": self.status.value,
                "kernel": self.kernel, "since": self.since, "evidence": self.evidence.to_dict(),
                "limits": list(self.limits)}

    @property
    def limits_cell(self) -> str:
        """`checks/encoded` for the table (`-` without checks)."""
        if not self.limits:
            return "-"
        return f"{len(self.limits)}/{sum(1 for lim in self.limits if lim['encoded'])}"


@dataclass(frozen=True)
class Coverage:
    """Every overload of one release, with what the rows were judged against."""

    release: str
    macos: str
    macos_source: str
    kb_version: str
    origin: str
    notes: tuple[str, ...]
    rows: tuple[CoverageRow, ...]
    silent: tuple[dict, ...] | None = None  # with --op: the known silent bugs of the matching ops, per release

    def summary(self) -> dict:
        """Row counts per kernel and per status."""
        return {"kernel": dict(Counter(r.kernel for r in self.rows)),
                "status": dict(Counter(r.status.value for r in self.rows))}

    def to_dict(self) -> dict:
        """JSON form: the release, its assumptions, the summary and the rows under "ops"."""
        return {"release": self.release, "macos": self.macos, "macos_source": self.macos_source,
                "kb_version": self.kb_version, "origin": self.origin, "notes": list(self.notes),
                "summary": self.summary(), "ops": [r.to_dict() for r in self.rows],
                **({"silent_bugs": list(self.silent)} if self.silent is not None else {})}


def kernel_of(op: OpKey, kb: Knowledge) -> str:
    """What serves `op` on MPS in kb's release (see the module docstring)."""
    if op in kb.facts.always_cpu:
        return "cpu_fallback"
    if kb.yaml.mps_kernel(op) is not None or op in kb.facts.outside_yaml:
        return "mps"
    if op in kb.facts.python_registrations:
        return "python"
    entry = kb.yaml.get(op)
    return "composite" if entry is not None and entry.composite else "none"


def status_of(op: OpKey, kb: Knowledge) -> Classification:
    """The dtype-free verdict; a composite is judged by what it calls (predict/composite.py)."""
    return judge_composite(op, (), kb)


def limits_of(op: OpKey, kb: Knowledge) -> tuple[dict, ...]:
    """The runtime checks of op's MPS kernel in kb's release: message, kind, where, encoded (rule id or None)."""
    if kb.limits is None or op.namespace != "aten":
        return ()
    own = {c.id: r.id for r, c in kb.limits.rules_for(op.yaml_name)}  # the rule that encodes it for this op
    encoded = {c.id: r.id for r, c in kb.limits.encoded}
    checks = list(kb.limits.by_op.get(op.yaml_name, ()))
    checks += [c for r, c in kb.limits.rules_for(op.yaml_name) if c not in checks]
    return tuple({"id": c.id, "message": c.message.strip(), "kind": c.kind, "where": c.where,
                  "encoded": own.get(c.id, encoded.get(c.id))} for c in checks)


def _statuses(kb: Knowledge) -> dict[OpKey, Classification]:
    """Every overload's status in one knowledge base."""
    return {op: status_of(op, kb) for op in kb.yaml.overloads}


def _since(ops: Iterable[OpKey], macos: str | None) -> dict[OpKey, str]:
    """op -> first covered release where its status is native."""
    from opscan.predict.history import release_groups

    found: dict[OpKey, str] = {}
    todo = set(ops)
    for group in release_groups():
        kb = load_knowledge(release=group.first, macos=macos)
        for op in [o for o in todo if kb.yaml.has(o) or o in kb.facts.outside_yaml]:
            if status_of(op, kb).verdict == Verdict.NATIVE:
                found[op] = group.first
                todo.discard(op)
    return found


def coverage(release: str | None = None, macos: str | None = None, with_since: bool = True) -> Coverage:
    """Every overload of `release` (default: the installed torch) at `macos` (default: its minimum)."""
    kb = load_knowledge(release=release, macos=macos)
    statuses = _statuses(kb)
    since = _since(statuses, macos) if with_since else {}
    rows = tuple(CoverageRow(op, found.verdict, kernel_of(op, kb), since.get(op), found.evidence, limits_of(op, kb))
                 for op, found in sorted(statuses.items()))
    return Coverage(kb.release, macos_text(kb.macos), kb.macos_source, kb.kb_version, kb.origin,
                    kb.notes, rows)


def select(cov: Coverage, statuses: Iterable[str] = (), kernels: Iterable[str] = (),
           pattern: str | None = None) -> Coverage:
    """The rows matching every given filter (`pattern`: a glob on `aten::name.overload` or on `name.overload`,
    else a substring of the former)."""
    from fnmatch import fnmatchcase

    statuses, kernels = set(statuses), set(kernels)

    def named(op: OpKey) -> bool:
        """Whether the op's name matches the pattern."""
        glob = pattern is not None and any(c in pattern for c in "*?[")
        return pattern is None or (fnmatchcase(op.display, pattern) or fnmatchcase(op.yaml_name, pattern) if glob
                                   else pattern in op.display)

    def keep(row: CoverageRow) -> bool:
        """Whether the row passes every filter."""
        return named(row.op) and (not statuses or row.status.value in statuses) and (not kernels or
                                                                                    row.kernel in kernels)

    rows = tuple(r for r in cov.rows if keep(r))
    silent = None if pattern is None else silent_listing(named)
    return Coverage(cov.release, cov.macos, cov.macos_source, cov.kb_version, cov.origin, cov.notes, rows, silent)


def silent_listing(named) -> tuple[dict, ...]:
    """The known silent bugs (knowledge/silent_bugs.yaml) of the ops `named(op)` accepts, each with the covered
    releases it affects (`opscan coverage --op`)."""
    from opscan.knowledge import kb_releases
    from opscan.knowledge.silent_bugs import load_bugs

    out = []
    for bug in load_bugs():
        ops = [op for op in bug.ops if named(OpKey.from_yaml(op))]
        if ops:
            out.append({"id": bug.id, "rule": bug.rule, "title": bug.title, "ops": ops, "issues": list(bug.issues),
                        "releases": [r for r in kb_releases() if bug.affected.covers(r)], "fixed_in": bug.fixed,
                        "macos": bug.macos_text, "chip": list(bug.chip) or None, "confidence": bug.confidence,
                        "workaround": bug.workaround})
    return tuple(out)


def diff(old: Coverage, new: Coverage) -> dict:
    """Kernel changes and status changes between two releases, listed apart ("absent": not declared)."""
    a, b = {r.op: r for r in old.rows}, {r.op: r for r in new.rows}
    kernel, status = [], []
    for op in sorted(set(a) | set(b)):
        ra, rb = a.get(op), b.get(op)
        ka, kb_ = (ra.kernel if ra else "absent"), (rb.kernel if rb else "absent")
        sa, sb = (ra.status.value if ra else "absent"), (rb.status.value if rb else "absent")
        head = {"op": op.op, "overload": op.overload}
        if ka != kb_:
            kernel.append({**head, "from": ka, "to": kb_})
        if sa != sb:
            status.append({**head, "from": sa, "to": sb, "evidence": (rb or ra).evidence.to_dict()})
    return {"from": old.release, "to": new.release, "macos": [old.macos, new.macos],
            "kernel_changes": kernel, "status_changes": status}


def render(data: dict, fmt: str) -> str:
    """JSON or YAML text of a coverage or diff dict."""
    if fmt == "json":
        return strict_json(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def table(cov: Coverage) -> str:
    """A plain-text table: header, summary, one line per row (rule instead of the evidence text)."""
    s = cov.summary()
    lines = [f"opscan coverage · torch {cov.release} ({cov.origin}) · macOS {cov.macos} assumed "
             f"({cov.macos_source.split(':')[0]}) · {len(cov.rows)} overloads",
             "kernel: " + " · ".join(f"{k} {s['kernel'].get(k, 0)}" for k in KERNELS),
             "status: " + " · ".join(f"{v} {n}" for v, n in sorted(s["status"].items())),
             *(f"note: {n}" for n in cov.notes)]
    width = max((len(r.op.display) for r in cov.rows), default=2)
    lines.append(f"{'op':<{width}}  {'kernel':<12}  {'status':<17}  {'since':<7}  {'checks':<6}  rule")
    for r in cov.rows:
        lines.append(f"{r.op.display:<{width}}  {r.kernel:<12}  {r.status.value:<17}  "
                     f"{r.since or '-':<7}  {r.limits_cell:<6}  {r.evidence.rule}")
    if cov.silent is not None:
        lines.append(f"known silent-correctness bugs of these ops: {len(cov.silent)}")
        for b in cov.silent:
            where = ", ".join(p for p in (b["macos"], b["chip"] and "/".join(b["chip"]) + " chips") if p)
            lines.append(f"  {b['rule']}  {', '.join(b['ops'])}  releases {' '.join(b['releases'])}  fixed "
                         f"{b['fixed_in']}{f'  ({where})' if where else ''}  #{b['issues'][0]}: {b['title']}")
    return "\n".join(lines) + "\n"


def diff_table(d: dict) -> str:
    """A plain-text rendering of `diff`."""
    lines = [f"opscan coverage diff · torch {d['from']} -> {d['to']}",
             f"kernel changes: {len(d['kernel_changes'])}"]
    lines += [f"  {_display(c)}: {c['from']} -> {c['to']}" for c in d["kernel_changes"]]
    lines.append(f"status changes: {len(d['status_changes'])}")
    lines += [f"  {_display(c)}: {c['from']} -> {c['to']} ({c['evidence']['rule']})" for c in d["status_changes"]]
    return "\n".join(lines) + "\n"


def _display(change: dict) -> str:
    """aten::name.overload of a diff entry."""
    return OpKey.from_json(change["op"], change["overload"]).display
