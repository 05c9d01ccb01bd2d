"""Report stage: the findings — one per cause, (the user's line, rule), built from the rows in one place.

A row is one (OpKey, dtype signature) of the step; one line of the user's code (`x.double()`) can make many of them,
and one row can be made at many lines. A finding is what the user fixes: the line and the rule, with every row
whose calls were made there under that rule listed as its `parts` (the op, its dtypes, the calls made at that line
and their phases), one `fix` and one `upstream` decision (report/upstream.py). Every view — the table, HTML, JSON's
`findings` section, SARIF, GitHub annotations, ISSUE.md — speaks in findings; the rows keep their detail.

Which line: a row's `where` entries (report/where.py), each its own site: the user's file and line (a notebook
cell's too), else the library's line it came through (`via`), else none. A row may name its own sites instead
(`Row.causes`, entries shaped like `where`'s: file, line, function, text, optionally phases and calls): a CPU
tensor meeting MPS kernels is caused by the line that created it, not by the lines that called the kernels
(report/placement.py). Such a cause may say what was made there (`kind`, `name`, `first_read`, `what`: the
finding's `origin`, and `what` leads its `why`), its own `fix`, and where its calls were made (`met`: the finding's
`met`, the lines where the tensor met MPS kernels). The placement model's rules (`placement-*`) group as one: one
host tensor is one finding at its line, whichever kernels refused it.

A finding may hold no row: a line of the user's code that picks a device (report/device_code.py's section entries
with a verdict — `raises` is `error`, `cpu` is `cpu_fallback`) is a finding at that line with what it asked
(`code`), while the step's ops are judged as they run once the line is fixed. Most severe first; ties in step order,
those with no row first (they run first: at build time or before the ops of their line). Pure: `build_findings` is
a function of the rows and the device-code entries alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscan.opkey import OpKey, Release, signature_text
from opscan.report.upstream import Upstream, upstream_of
from opscan.verdict import Source, Verdict

SITE_KEYS = ("file", "line", "function", "text", "cell", "by", "via")
ORIGIN_KEYS = ("kind", "name", "first_read", "what")  # what a cause says was made at its line
GROUPED_RULES = ("placement-",)  # rule prefixes whose rules make one finding per site
MAX_MET = 10  # lines listed where a cause's calls were made


@dataclass(frozen=True)
class Part:
    """One row's share of a finding: its calls made at the finding's line."""

    row: int  # index into Report.rows (the JSON's `ops`)
    op: OpKey
    dtypes: tuple[str, ...]
    verdict: Verdict
    calls: int
    phases: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"row": self.row, "op": self.op.display, "dtypes": list(self.dtypes), "verdict": self.verdict.value,
                "calls": self.calls, "phases": list(self.phases)}


@dataclass(frozen=True)
class Code:
    """What a line of the user's code asked, for a finding no row holds (device code, predict/device_code.py): the
    call as written, how many times it ran, and when ("build": import, factory, example inputs; "step")."""

    asked: str
    calls: int
    phase: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a finding's `code`)."""
        return {"asked": self.asked, "calls": self.calls, "phase": self.phase}


@dataclass(frozen=True)
class Finding:
    """One cause: a line of the user's code (`site`; None when no line is known) and the rule that judged its calls,
    with the rows made there (`parts`, worst first), what happens and why (the worst part's evidence), one fix, and
    whether it belongs upstream."""

    rule: str
    verdict: Verdict  # the worst part's
    source: Source
    site: dict[str, Any] | None
    parts: tuple[Part, ...]
    why: str
    evidence_source: str
    fix: str | None
    since: str | None  # first covered release where every part is native (None: none, or not known)
    upstream: Upstream
    modules: tuple[str, ...]
    origin: dict[str, Any] | None = None  # what was made at its line, when that caused the calls (a host tensor)
    met: tuple[dict[str, Any], ...] = ()  # then: the lines where its calls were made (`where` entries)
    code: Code | None = None  # a finding no row holds: what its line asked (device code)

    @property
    def ops(self) -> tuple[str, ...]:
        """Its ops' display names, once each, worst first (none for a finding no row holds)."""
        return tuple(dict.fromkeys(p.op.display for p in self.parts))

    @property
    def calls(self) -> int:
        """Calls made at its line under its rule (those of its code when no row holds it)."""
        return sum(p.calls for p in self.parts) if self.parts else (self.code.calls if self.code else 0)

    @property
    def phases(self) -> tuple[str, ...]:
        """Phases of those calls, in step order."""
        order = ("forward", "loss", "backward", "optimizer")
        found = {ph for p in self.parts for ph in p.phases}
        return tuple(sorted(found, key=lambda ph: (order.index(ph) if ph in order else len(order), ph)))

    @property
    def key(self) -> str:
        """A stable identity across reruns (SARIF's fingerprint): the rule, the file, the function and the line's
        text — not its number, which moves when lines above it change."""
        site = self.site or {}
        return "|".join(str(site.get(k) or "") for k in ("file", "function", "text")) + f"|{self.rule}"

    def summary(self) -> str:
        """"aten::take [float32,int64], aten::put_ [float32,int64,float32]": its ops and dtype signatures (what its line
        asked when no row holds it)."""
        if not self.parts and self.code is not None:
            return self.code.asked
        return ", ".join(f"{p.op.display} [{signature_text(p.dtypes)}]" for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (an entry of the report's `findings`); `origin` and `met` only for a cause that made what its
        calls used, `code` only for a finding no row holds."""
        extra = {"origin": self.origin, "met": [dict(m) for m in self.met] if self.met else None,
                 "code": self.code.to_dict() if self.code else None}
        return {"rule": self.rule, "verdict": self.verdict.value, "source": self.source.value,
                "site": None if self.site is None else _site_json(self.site), "ops": list(self.ops),
                "parts": [p.to_dict() for p in self.parts], "calls": self.calls, "phases": list(self.phases),
                "modules": list(self.modules), "why": self.why, "evidence_source": self.evidence_source,
                "fix": self.fix, "since": self.since, "upstream": self.upstream.to_dict(), "key": self.key,
                **{k: v for k, v in extra.items() if v is not None}}


def build_findings(rows, release: str | None = None, device_code=()) -> tuple[Finding, ...]:
    """The findings of `rows` (Report.rows) judged for torch `release`: every row ranked above native, grouped by
    (site, rule); and one per entry of `device_code` (the report's `device_code` section's findings) with a
    verdict."""
    groups: dict[tuple, list[tuple[int, dict | None, int, tuple[str, ...]]]] = {}
    for index, row in enumerate(rows):
        if row.verdict.rank == 0:
            continue
        rule = next((p for p in GROUPED_RULES if row.evidence.rule.startswith(p)), row.evidence.rule)
        for site, calls, phases in sites_of(row):
            groups.setdefault((_site_key(site), rule), []).append((index, site, calls, phases))
    found = [_finding(rows, members, release) for members in groups.values()]
    found += [_code_finding(entry) for entry in device_code if entry.get("verdict")]
    return tuple(sorted(found, key=lambda f: (-f.verdict.rank, f.parts[0].row if f.parts else -1)))


def sites_of(row) -> list[tuple[dict | None, int, tuple[str, ...]]]:
    """(site, calls, phases) for each place a row's calls were caused: its own `causes` when it names them, else
    its `where` entries, else one unknown site with all its calls."""
    named = getattr(row, "causes", ()) or row.where
    if not named:
        return [(None, row.calls, tuple(row.phases))]
    return [(dict(site), int(site.get("calls") or row.calls), tuple(site.get("phases") or row.phases))
            for site in named]


def _site_key(site: dict | None) -> tuple:
    if not site:
        return ()
    if site.get("file"):
        return ("user", site["file"], site.get("line"))
    via = site.get("via") or {}
    return ("via", via.get("file"), via.get("line")) if via else ()


def _finding(rows, members, release: str | None) -> Finding:
    merged: dict[int, list] = {}
    for index, _, calls, phases in members:
        entry = merged.setdefault(index, [0, []])
        entry[0] += calls
        entry[1] += [p for p in phases if p not in entry[1]]
    parts = sorted((Part(i, rows[i].op, rows[i].dtypes, rows[i].verdict, calls, tuple(phases))
                    for i, (calls, phases) in merged.items()), key=lambda p: (-p.verdict.rank, p.row))
    worst = rows[parts[0].row]
    chosen = [rows[p.row] for p in parts]
    sites = [s for _, s, _, _ in members if s]
    made = next((s for s in sites if s.get("what")), None)
    origin = {k: made.get(k) for k in ORIGIN_KEYS} if made else None
    return Finding(
        rule=worst.evidence.rule, verdict=worst.verdict, source=worst.source, site=_site(members),
        parts=tuple(parts), why=f"{made['what']} — {worst.evidence.text}" if made else worst.evidence.text,
        evidence_source=worst.evidence.source, fix=next((s["fix"] for s in sites if s.get("fix")), _fix(chosen)),
        since=_since(chosen, release), upstream=_upstream(worst.evidence.rule, worst.verdict, chosen, release),
        modules=tuple(dict.fromkeys(m for r in chosen for m in r.modules)), origin=origin, met=_met(sites),
    )


def _met(sites) -> tuple[dict[str, Any], ...]:
    """The lines where the members' calls were made, when their sites say so: once each (their phases and calls
    joined), at most MAX_MET."""
    met: dict[tuple, dict[str, Any]] = {}
    for place in (m for s in sites for m in s.get("met") or ()):
        via = place.get("via") or {}
        key = (place.get("file"), place.get("line"), via.get("file"), via.get("line"))
        if key not in met:
            met[key] = {**place, "phases": list(place.get("phases") or ())}
            continue
        met[key]["phases"] += [p for p in place.get("phases") or () if p not in met[key]["phases"]]
        met[key]["calls"] = int(met[key].get("calls") or 0) + int(place.get("calls") or 0)
    return tuple(met.values())[:MAX_MET]


def _code_finding(entry: dict[str, Any]) -> Finding:
    """A device-code entry (report/device_code.py) as a finding no row holds."""
    rule, verdict = str(entry["rule"]), Verdict(entry["verdict"])
    site = {"file": entry.get("file"), "line": entry.get("line"), "function": entry.get("function"),
            "text": entry.get("code"), "cell": None, "by": "call", "via": entry.get("via")}
    return Finding(
        rule=rule, verdict=verdict, source=Source.PREDICTED, site=site if site["file"] or site["via"] else None,
        parts=(), why=str(entry.get("text") or ""), evidence_source=str(entry.get("source") or ""),
        fix=entry.get("fix"), since=None, upstream=upstream_of(rule, verdict.value, ()), modules=(),
        code=Code(str(entry.get("asked")), int(entry.get("calls") or 1), str(entry.get("phase") or "step")),
    )


def _site(members) -> dict[str, Any] | None:
    """The site all the members share (the first one's words for it)."""
    site = next((s for _, s, _, _ in members if s), None)
    return None if site is None else {k: site.get(k) for k in SITE_KEYS}


def _site_json(site: dict[str, Any]) -> dict[str, Any]:
    via = site.get("via")
    return {**{k: site.get(k) for k in SITE_KEYS}, "via": dict(via) if via else None}


def _fix(rows) -> str | None:
    """The remedy most of its rows give (the worst row's on a tie)."""
    remedies = [r.remedy for r in rows if r.remedy]
    return max(dict.fromkeys(remedies), key=remedies.count) if remedies else None


def _since(rows, release: str | None) -> str | None:
    """The later release from which every row is native, when each has one (a row native in `release` itself, as
    predicted, but measured otherwise, has none)."""
    known = [r.since for r in rows]
    if not known or None in known:
        return None
    since = max(known, key=Release.parse)
    return since if release is None or Release.parse(since) > Release.parse(release) else None


def _upstream(rule: str, verdict: Verdict, rows, release: str | None) -> Upstream:
    texts = [t for r in rows for t in (r.evidence.text, r.evidence.source)]
    texts += [t for r in rows for t in ((r.predicted or {}).get("evidence") or {}).values() if isinstance(t, str)]
    issues = [n for r in rows for n in (r.silent or {}).get("issues") or ()]
    also = [r.predicted["evidence"]["rule"] for r in rows if (r.predicted or {}).get("evidence", {}).get("rule")]
    return upstream_of(rule, verdict.value, [r.op.display for r in rows], _since(rows, release), texts, issues, also,
                       [d for r in rows for d in r.dtypes])
