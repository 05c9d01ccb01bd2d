"""Render stage: the console's tables and finding entries as plain segments (no rich here: render/console.py
colours and prints them).

A line is a tuple of segments, each (text, the verdict whose colour it takes, or None). Tables fit the width they
are given: columns padded to their widest cell, two spaces apart; when the line would be wider, the columns marked
`sub=1` (the user's line, the rule) move to a sub-line of their own under the row, indented, then the columns marked
`shrink` are cut with "…" down to their minimum, then the `sub=2` ones (calls, phases) move too. The user's
`path:line` is never cut: on its sub-line a long path folds where the console folds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from opscan.opkey import signature_text
from opscan.report.where import at_text, short_place

Segment = tuple[str, str | None]
Line = tuple[Segment, ...]
GAP = "  "
PHASE_SHORT = {"forward": "fwd", "loss": "loss", "backward": "bwd", "optimizer": "opt"}


@dataclass(frozen=True)
class Column:
    """A table column: its header; `sub`, when it may move to the row's sub-line (1 first, then 2); `shrink`, the
    width it may be cut to (0: never); `styled`, whether its cells take the colour of the row's verdict."""

    name: str
    sub: int = 0
    shrink: int = 0
    styled: bool = False


def grid(columns: list[Column], cells: list[list[str]], verdicts: list[str], width: int) -> list[Line]:
    """The table: a header line and one line per row (plus its sub-line when columns had to move): first the
    `sub=1` columns move, then the `shrink` ones are cut, then the `sub=2` ones move."""
    natural = [max([len(c.name), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    shown, widths = list(range(len(columns))), natural
    for tier in (1, 2):
        if _width(widths, shown) <= width:
            break
        shown = [i for i in shown if columns[i].sub != tier]
        widths = _shrunk(natural, shown, columns, width)
    moved = [i for i in range(len(columns)) if i not in shown]
    header = "".join(_pad(columns[i].name, widths[i], i == shown[-1]) for i in shown).rstrip()
    lines: list[Line] = [((header, None),)]
    for row, verdict in zip(cells, verdicts):
        lines.append(tuple((_pad(_cut(row[i], widths[i]), widths[i], i == shown[-1]),
                            verdict if columns[i].styled else None) for i in shown))
        below = " · ".join(f"{columns[i].name} {row[i]}" if columns[i].sub == 2 else row[i]
                           for i in moved if row[i])
        if below:
            lines.append(((" " * (widths[0] + len(GAP)) + below, None),))
    return lines


def _shrunk(natural: list[int], shown: list[int], columns: list[Column], width: int) -> list[int]:
    """The widths with the `shrink` columns cut (in order, each to its minimum at most) until the shown ones fit."""
    widths = list(natural)
    for i in (i for i in shown if columns[i].shrink):
        over = _width(widths, shown) - width
        if over > 0:
            widths[i] = max(columns[i].shrink, len(columns[i].name), widths[i] - over)
    return widths


def _width(widths: list[int], shown) -> int:
    shown = list(shown)
    return sum(widths[i] for i in shown) + len(GAP) * (len(shown) - 1)


def _pad(text: str, width: int, last: bool) -> str:
    return text if last else text.ljust(width) + GAP


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def findings_table(findings, width: int) -> list[Line]:
    """One row per finding: its number, verdict, the user's line, its ops, calls and phases."""
    columns = [Column("#"), Column("verdict", styled=True), Column("where", sub=1),
               Column("ops", shrink=20), Column("calls", sub=2), Column("phases", sub=2)]
    cells = [[str(n), f.verdict.value, site_text(f.site), _ops(f), str(f.calls),
              phases_text(f.phases) or (f.code.phase if f.code else "")]
             for n, f in enumerate(findings, 1)]
    return grid(columns, cells, [f.verdict.value for f in findings], width)


def rows_table(rows, width: int, measured: str | None, modules, places, rules) -> list[Line]:
    """The -v table: every row given, with its module, op, dtypes, verdict (and the other verdict when measured),
    calls, phases, the user's line and the rule. `modules`, `places`, `rules`: cell texts per row."""
    columns = [Column("#"), Column("module", shrink=12), Column("op", shrink=24), Column("dtypes"),
               Column("verdict", styled=True), *([Column(measured)] if measured else []), Column("calls", sub=2),
               Column("phases", sub=2), Column("where", sub=1), Column("rule", sub=1)]
    cells = []
    for n, (row, module, place, rule) in enumerate(zip(rows, modules, places, rules), 1):
        other = [_other(row)] if measured else []
        cells.append([str(n), module, row.op.display, signature_text(row.dtypes), row.verdict.value, *other,
                      str(row.calls), phases_text(row.phases), place, rule])
    return grid(columns, cells, [r.verdict.value for r in rows], width)


def _other(row) -> str:
    if not row.measured:
        return "-"
    mark = " ≠" if row.disagrees else ""
    return f"{row.predicted['verdict'] if row.predicted else row.measured['verdict']}{mark}"


def _ops(finding) -> str:
    ops = finding.ops
    if not ops:
        return finding.code.asked if finding.code else ""
    return ops[0] + (f" (+{len(ops) - 1})" if len(ops) > 1 else "") if len(", ".join(ops)) > 48 else ", ".join(ops)


def phases_text(phases) -> str:
    """"fwd,bwd"."""
    return ",".join(PHASE_SHORT.get(p, p) for p in phases)


def site_text(site: dict | None) -> str:
    """The user's `path:line` (a notebook's `Cell In[n], line k`); "via lib/file.py:12" when only a library's line is
    known; "(no line)" when none is."""
    if not site:
        return "(no line)"
    if site.get("file"):
        return at_text(site)
    via = site.get("via") or {}
    return f"via {via.get('file')}:{via.get('line')}" if via else "(no line)"


def finding_entry(number: int, finding, rows) -> list[Line]:
    """A finding's "why, and what to do": where, the source line, its ops (or what the line asked, when no row holds
    it), where a tensor made there met MPS kernels, why, the rule, the fix, upstream."""
    first = rows[finding.parts[0].row] if finding.parts else None
    lines: list[Line] = [(("[" + str(number) + "] " + _heading_place(finding.site) + ": ", None),
                          (finding.verdict.value, finding.verdict.value), (f" ({finding.source.value})", None))]
    site = finding.site or {}
    if site.get("text"):
        lines.append(((f"      {site['text']}", None),))
    if site.get("file") and site.get("via"):
        lines.append(((f"    via {_via(site['via'])}", None),))
    parts = "; ".join(f"{p.op.display} [{signature_text(p.dtypes)}] ({', '.join(p.phases)}, {p.calls} call"
                      f"{'s' * (p.calls != 1)})" for p in finding.parts)
    if parts:
        lines.append(((f"    ops: {parts}", None),))
    if finding.code is not None:
        code = finding.code
        lines.append(((f"    asked: {code.asked} ({code.phase}, {code.calls} call{'s' * (code.calls != 1)})", None),))
    if finding.met:
        lines.append(((f"    met MPS kernels at: {met_text(finding.met)}", None),))
    lines.append(((f"    why: {finding.why}", None),))
    lines.append(((f"    rule: {finding.rule} · source: {finding.evidence_source}", None),))
    lines += [((text, None),) for text in _measured_lines(first)]
    if first is not None and first.cpu_op is not None:
        lines.append(((f"    CPU trace shows: {first.cpu_op.display}", None),))
    if finding.fix:
        lines.append(((f"    fix: {finding.fix}", None),))
    lines.append(((f"    upstream: {finding.upstream.text}", None),))
    return lines


def met_text(met) -> str:
    """"host_tensor.py:38 in TinyTagger.forward (forward, backward); …": where a cause's calls were made."""
    return "; ".join(f"{short_place(m)} in {m.get('function')} ({', '.join(m.get('phases') or ())})"
                     if m.get("file") else short_place(m) for m in met)


def _heading_place(site: dict | None) -> str:
    if not site:
        return "no line of your code is known"
    if not site.get("file"):
        return f"no line of your code; via {_via(site['via'])}" if site.get("via") else "no line of your code is known"
    place = f"{at_text(site)} in {site.get('function')}"
    return place + (" (the factory: opscan's default step ran its model)" if site.get("by") == "factory" else "")


def _via(via: dict) -> str:
    return f"{via.get('file')}:{via.get('line')} in {via.get('function')}"


def _measured_lines(row) -> list[str]:
    if row is None:
        return []
    if row.predicted:
        return [f"    predicted: {row.predicted['verdict']} ({row.predicted['evidence']['rule']})"]
    if row.measured:
        return [f"    measured on {row.measured['device']} (not MPS): {row.measured['verdict']} — "
                f"{row.measured['text']}"]
    return []
