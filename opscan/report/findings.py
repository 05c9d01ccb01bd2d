"""Report stage: the findings — one per cause, (the user's line, rule), built from the rows in one place.

A row is one (OpKey, dtype signature) of the step; one line of the user's code (`x.double()`) can make many of them,
and one row can be made at many lines. A finding is what the user fixes: the line and the rule, with every row
whose calls were made there under that rule listed as its `parts` (the op, its dtypes, the calls made at that line
and their phases), one `fix` and one `upstream` decision (report/upstream.py). Every view — the table, HTML, JSON's
`findings` section, SARIF, GitHub annotations, ISSUE.md — speaks in findings; the rows keep their detail.

Which line: a row's `where` entries (report/where.py), each its own site: the user's file and line (a notebook
cell's too), else the library's line it came through (`via`), else none. A row may name its own sites instead
(`Row.causes`, entries shaped like `where`'s: file, line, function, text, optionally phases and calls): a CPU
tensor meeting MPS kernels is caused by the line that created it, not by the lines that called the kernels.
Most severe first; ties in step order. Pure: `build_findings(rows)` is a function of the rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscan.opkey import OpKey, Release, signature_text
from opscan.report.upstream import Upstream, upstream_of
from opscan.verdict import Source, Verdict

SITE_KEYS = ("file", "line", "function", "text", "cell", "by", "via")


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

    @property
    def ops(self) -> tuple[str, ...]:
        """Its ops' display names, once each, worst first."""
        return tuple(dict.fromkeys(p.op.display for p in self.parts))

    @property
    def calls(self) -> int:
        """Calls made at its line under its rule."""
        return sum(p.calls for p in self.parts)

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
        """"aten::take [float32,int64], aten::put_ [float32,int64,float32]": its ops and dtype signatures."""
        return ", ".join(f"{p.op.display} [{signature_text(p.dtypes)}]" for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (an entry of the report's `findings`)."""
        return {"rule": self.rule, "verdict": self.verdict.value, "source": self.source.value,
                "site": None if self.site is None else _site_json(self.site), "ops": list(self.ops),
                "parts": [p.to_dict() for p in self.parts], "calls": self.calls, "phases": list(self.phases),
                "modules": list(self.modules), "why": self.why, "evidence_source": self.evidence_source,
                "fix": self.fix, "since": self.since, "upstream": self.upstream.to_dict(), "key": self.key}


def build_findings(rows, release: str | None = None) -> tuple[Finding, ...]:
    """The findings of `rows` (Report.rows) judged for torch `release`: every row ranked above native, grouped by
    (site, rule)."""
    groups: dict[tuple, list[tuple[int, dict | None, int, tuple[str, ...]]]] = {}
    for index, row in enumerate(rows):
        if row.verdict.rank == 0:
            continue
        for site, calls, phases in sites_of(row):
            groups.setdefault((_site_key(site), row.evidence.rule), []).append((index, site, calls, phases))
    found = [_finding(rows, members, release) for members in groups.values()]
    return tuple(sorted(found, key=lambda f: (-f.verdict.rank, f.parts[0].row if f.parts else 0)))


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
    return Finding(
        rule=worst.evidence.rule, verdict=worst.verdict, source=worst.source, site=_site(members),
        parts=tuple(parts), why=worst.evidence.text, evidence_source=worst.evidence.source, fix=_fix(chosen),
        since=_since(chosen, release), upstream=_upstream(worst.evidence.rule, worst.verdict, chosen, release),
        modules=tuple(dict.fromkeys(m for r in chosen for m in r.modules)),
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
