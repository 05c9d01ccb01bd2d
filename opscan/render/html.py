"""Render stage: the self-contained HTML report (one file: inline CSS, inline SVG, two tiny inline scripts).

Sections: the verdict summary and the lane with its reasons; each finding — one per cause, a line of the user's code
and a rule (report/findings.py) — with that line and its source text, the ops made there (linked to their rows in
the op table), its evidence, fix, upgrade advice and where it belongs upstream, and a drawing of each of its ops'
neighbourhoods in its module context (render/svg.py; never the whole graph); host<->device transfers (totals, per
phase, the ranking, fallback regions and what moving each to the CPU explicitly saves); the module tree coloured by
worst verdict; the op table; memory (when the report has it); the environment record. Nothing is fetched when the
page is viewed.
"""

from __future__ import annotations

import json
from opscan.trust.text import html_text as escape

from opscan.opkey import signature_text
from opscan.report import Report
from opscan.report.findings import Finding
from opscan.report.where import place_text, short_place, short_places
from opscan.render.html_assets import ERROR_HOOK, PAGE_SCRIPT, STYLE
from opscan.render.html_memory import memory_html
from opscan.render.svg import neighbourhood_svg
from opscan.units import human_bytes
from opscan.verdict import Verdict


def render_html(report: Report, **_) -> str:
    """The report as one HTML page."""
    body = html_sections(report, tuple(PAGE_SECTIONS))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>opscan · {escape(report.model_name)}</title><script>{ERROR_HOOK}</script>"
            f"<style>{STYLE}</style></head>\n<body data-lane=\"{escape(report.lane.name)}\">\n"
            + "\n".join(p for p in body if p)
            + '\n<section><ul id="opscan-errors"></ul></section>'
            + f"\n<script>{PAGE_SCRIPT}</script></body></html>\n")


def html_sections(report: Report, names: tuple[str, ...], filter_box: bool = True) -> list[str]:
    """The page's sections `names` (keys of PAGE_SECTIONS, in that order), each an HTML string ("" when the report has
    nothing for it): the page and the notebook view (render/notebook.py) share them. `filter_box`: the op table's
    filter field (it needs the page's script)."""
    return [_ops(report, filter_box) if name == "ops" else PAGE_SECTIONS[name](report) for name in names]


def _v(verdict: str) -> str:
    return f'<span class="v v-{escape(verdict)}">{escape(verdict)}</span>'


def _header(report: Report) -> str:
    a = report.assumptions
    what = "training step" if report.trace.get("step") == "train" else "inference forward"
    return (f"<header><h1>opscan · {escape(report.model_name)}</h1><div class=\"meta\">{escape(report.model)} · "
            f"{what} · {escape(report.mode)} for torch {escape(str(a.get('torch_release')))} on macOS "
            f"{escape(str(a.get('macos')))} (installed {escape(str(a.get('installed_torch')))}) · "
            f"{report.trace.get('calls', 0)} calls traced, {report.trace.get('mps_view_calls', '?')} as MPS "
            f"dispatches them</div></header>")


def _summary(report: Report) -> str:
    pills = "".join(f'<span class="pill"><b class="v v-{v}">{v}</b>{c["ops"]} ops · {c["calls"]} calls</span>'
                    for v, c in report.summary.items() if c["ops"] or v in ("native", "unknown"))
    reasons = "".join(f"<li>{escape(r)}</li>" for r in report.lane.reasons[:20])
    more = f"<li>… and {len(report.lane.reasons) - 20} more</li>" if len(report.lane.reasons) > 20 else ""
    return (f'<section id="summary"><h2>Verdicts</h2><div class="pills">{pills}</div>'
            f'<h2>Lane</h2><span class="lane lane-{escape(report.lane.name)}">{escape(report.lane.name)}</span> '
            f'<span class="small">({escape(report.mode if report.mode == "simulated" else report.lane.source)})</span>'
            f"<ul>{reasons}{more}</ul></section>")


def _findings(report: Report) -> str:
    shown = {nb["row"]: nb for nb in (report.graph or {}).get("neighbourhoods", [])}
    findings = report.findings
    if not findings:
        return f'<section id="findings"><h2>Findings</h2><p>All {len(report.rows)} rows are native.</p></section>'
    order = {path: i for i, (path, _) in enumerate(report.modules)}
    types = dict(report.modules)
    cards = [_finding(n, f, report.rows, [shown[p.row] for p in f.parts if p.row in shown], order, types,
                      report.transfers) for n, f in enumerate(findings, 1)]
    return (f'<section id="findings"><h2>Findings</h2><p class="small">One per cause: a line of your code and the '
            f"rule that judged its calls ({len(findings)} causes, "
            f"{len({p.row for f in findings for p in f.parts})} of {len(report.rows)} rows).</p>"
            + "".join(cards) + "</section>")


def _finding(number: int, finding: Finding, rows, drawn: list, order, types, transfers) -> str:
    first = rows[finding.parts[0].row] if finding.parts else None
    lines = [f"<h3>[{number}] {_site_html(finding.site)} — {_v(finding.verdict.value)} "
             f'<span class="small">({escape(finding.source.value)})</span></h3>']
    if (finding.site or {}).get("text"):
        lines.append(f'<pre class="source"><code>{escape(finding.site["text"])}</code></pre>')
    parts = "".join(f'<li><a href="#op-{p.row}">{escape(p.op.display)}</a> <code>{escape(signature_text(p.dtypes))}'
                    f"</code> {_v(p.verdict.value)} <span class=\"small\">({escape(', '.join(p.phases))}, "
                    f"{p.calls} call{'s' * (p.calls != 1)})</span></li>" for p in finding.parts)
    if finding.code is not None:
        parts += (f"<li><code>{escape(finding.code.asked)}</code> <span class=\"small\">({escape(finding.code.phase)}"
                  f", {finding.code.calls} call{'s' * (finding.code.calls != 1)})</span></li>")
    if finding.met:
        lines.append('<p class="small">met MPS kernels at: '
                     + "; ".join(f"<code>{escape(place_text(m, via=False) or short_place(m))}</code>"
                                 for m in finding.met) + "</p>")
    lines += [f"<ul class=\"parts\">{parts}</ul>", f"<p>{escape(finding.why)}</p>",
              f'<p class="small">rule {escape(finding.rule)} · source: {escape(finding.evidence_source)} · '
              f"modules: {escape(', '.join(m or '(model)' for m in finding.modules[:5]))} · {finding.calls} calls</p>"]
    if first is not None and first.cpu_op is not None:
        lines.append(f'<p class="small">CPU trace shows {escape(first.cpu_op.display)}</p>')
    if finding.fix:
        lines.append(f"<p><b>Fix:</b> {escape(finding.fix)}</p>")
    if finding.since:
        lines.append(f"<p><b>Upgrade:</b> native from torch {escape(finding.since)}</p>")
    # the links as text: the page links only within itself (nothing it refers to is fetched when it is viewed)
    lines.append(f"<p><b>Upstream:</b> {escape(finding.upstream.text)}"
                 + "".join(f" <code>{escape(url)}</code>" for url in finding.upstream.links) + "</p>")
    indices = {p.row for p in finding.parts}
    moved = [r for r in (transfers or {}).get("ranking", []) if r["row"] in indices]
    if moved:
        b, s = sum(r["bytes"] for r in moved), sum(r["syncs"] for r in moved)
        lines.append(f"<p><b>Per step:</b> {human_bytes(b)} copied between host and device, {s} syncs</p>")
    lines += [f'<div class="graph-box">{neighbourhood_svg(nb, order, types)}</div>' for nb in drawn]
    anchor = (f'id="finding-{finding.parts[0].row}" data-row="{finding.parts[0].row}"' if finding.parts
              else f'id="finding-n{number}"')
    return f'<article class="card finding" {anchor}>{"".join(lines)}</article>'


def _site_html(site: dict | None) -> str:
    """The finding's line: `path:line in function` (via the library's line), or that none is known."""
    if not site or not (site.get("file") or site.get("via")):
        return "no line of your code is known"
    if not site.get("file"):
        return f'no line of your code; via <code>{escape(_via(site["via"]))}</code>'
    text = f"<code>{escape(place_text(site, via=False))}</code>"
    return text + (f' <span class="small">via <code>{escape(_via(site["via"]))}</code></span>' if site.get("via")
                   else "")


def _via(via: dict) -> str:
    return f"{via['file']}:{via['line']} in {via['function']}"


def _cost_cells(c: dict) -> str:
    return (f'<td class="num">{human_bytes(c["d2h_bytes"])}</td><td class="num">{c["d2h_syncs"]}</td>'
            f'<td class="num">{human_bytes(c["h2d_bytes"])}</td><td class="num">{c["h2d_syncs"]}</td>')


_COST_HEAD = "<th>to host</th><th>syncs</th><th>to device</th><th>syncs</th>"


def _transfers(report: Report) -> str:
    t = report.transfers
    if not t:
        return ""
    kinds = "".join(f"<tr><td>{k}</td><td class=\"num\">{t[k]['calls']}</td>{_cost_cells(t[k])}</tr>"
                    for k in ("fallback", "explicit", "implicit"))
    phases = "".join(f"<tr><td>{escape(p)}</td>{_cost_cells(c)}</tr>" for p, c in t["by_phase"].items())
    return (f'<section id="transfers"><h2>Host ↔ device transfers per step</h2><p class="small">'
            f"Assumes {escape(t['assumes'])}.</p><table><tr><th>kind</th><th>calls</th>{_COST_HEAD}</tr>{kinds}"
            f"<tr><th>step</th><th></th>{_cost_cells(t['step'])}</tr></table>{_footprint(t['footprint'])}"
            f"<h2>Per phase</h2><table><tr><th>phase</th>{_COST_HEAD}</tr>{phases}</table>"
            f"{_ranking(t['ranking'])}{_regions(t['regions'])}</section>")


def _footprint(f: dict) -> str:
    total = f["parameters_bytes"] + f["activations_bytes"]
    share = min(100.0, 100.0 * f["fallback_bytes"] / total) if total else 0.0
    verdict = "more than" if f["fallback_exceeds"] else "less than"
    return (f'<p>The CPU fallback moves {human_bytes(f["fallback_bytes"])} per step, {verdict} the step\'s '
            f'parameters and activations ({human_bytes(total)}).</p><div class="bar" title="{share:.1f}%">'
            f'<span style="width:{share:.1f}%"></span></div>')


def _ranking(ranking: list) -> str:
    if not ranking:
        return "<p>Nothing is copied between host and device.</p>"
    rows = "".join(f'<tr><td>{n}</td><td><a href="#finding-{r["row"]}">{escape(r["op"])}</a></td>'
                   f'<td>{escape(r["label"])}</td><td>{escape(r["module"] or "(model)")}</td>'
                   f'<td>{escape(r["phase"])}</td>{_cost_cells(r)}</tr>' for n, r in enumerate(ranking, 1))
    return (f'<h2>Transfer-heavy calls</h2><table id="ranking"><tr><th>#</th><th>op</th><th>why</th>'
            f"<th>module</th><th>phase</th>{_COST_HEAD}</tr>{rows}</table>")


def _regions(regions: list) -> str:
    if not regions:
        return ""
    items = "".join(
        f'<div class="card region"><b>{escape(", ".join(r["ops"]))}</b> in '
        f'{escape(", ".join(m or "(model)" for m in r["modules"]))} ({escape(", ".join(r["phases"]))}): '
        f'the fallback copies {human_bytes(r["per_call"]["bytes"])} with {r["per_call"]["syncs"]} syncs per step. '
        f"Moving this region to the CPU explicitly (one <code>.cpu()</code> per tensor entering it, one "
        f"<code>.to(\"mps\")</code> per result leaving it"
        + (f"; keep {escape(', '.join(r['keep_on_host']))} on the CPU" if r["keep_on_host"] else "")
        + f') copies {human_bytes(r["explicit"]["bytes"])} with {r["explicit"]["syncs"]} syncs: saves '
        f'{human_bytes(r["saved"]["bytes"])} and {r["saved"]["syncs"]} syncs.</div>' for r in regions)
    return f"<h2>Fallback regions</h2>{items}"


def _tree(report: Report) -> str:
    worst: dict[str, Verdict] = {}
    for row in report.rows:
        for prefix in {p for module in row.modules for p in _prefixes(module)}:
            if prefix not in worst or row.verdict.rank > worst[prefix].rank:
                worst[prefix] = row.verdict
    children: dict[str, list[tuple[str, str]]] = {}
    for path, kind in report.modules:
        if path:
            children.setdefault(path.rpartition(".")[0], []).append((path, kind))
    kind = dict(report.modules).get("", report.model_name)
    root = escape(report.model_name) + (f" ({escape(kind)})" if kind != report.model_name else "")
    return (f'<section id="modules"><h2>Module tree (worst verdict)</h2><ul class="tree">'
            f'{_branch("", root, children, worst)}</ul></section>')


def _branch(path: str, label: str, children: dict, worst: dict) -> str:
    verdict = worst.get(path)
    colour = f' style="background:var(--{verdict.value})"' if verdict else ""
    tag = f" {_v(verdict.value)}" if verdict and verdict != Verdict.NATIVE else ""
    kids = "".join(_branch(p, f"{escape(p.rpartition('.')[2])} ({escape(k)})", children, worst)
                   for p, k in children.get(path, []))
    return (f'<li data-module="{escape(path)}"><span class="dot"{colour}></span>{label}{tag}'
            + (f'<ul class="tree">{kids}</ul>' if kids else "") + "</li>")


def _prefixes(module: str):
    yield ""
    parts = module.split(".") if module else []
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def _ops(report: Report, filter_box: bool = True) -> str:
    rows = sorted(enumerate(report.rows), key=lambda ir: (-ir[1].verdict.rank, ir[0]))
    body = "".join(
        f"<tr id=\"op-{i}\"><td>{escape(r.op.display)}</td><td><code>{escape(signature_text(r.dtypes))}</code></td>"
        f"<td>{_v(r.verdict.value)}</td><td class=\"num\">{r.calls}</td><td>{escape(','.join(r.phases))}</td>"
        f"<td>{escape(', '.join(m or '(model)' for m in r.modules[:3]))}{' …' if len(r.modules) > 3 else ''}</td>"
        f"<td>{escape(short_places(r.where))}</td>"
        f"<td>{escape(r.evidence.text)}<br><span class=\"small\">{escape(r.evidence.rule)} · "
        f"{escape(r.evidence.source)}</span></td><td>{escape(r.remedy or '')}</td>"
        f"<td>{escape(r.since or '')}</td></tr>" for i, r in rows)
    box = '<input id="op-filter" type="search" placeholder="filter rows" aria-label="filter rows">' * filter_box
    return (f'<section id="ops"><h2>Operators ({len(report.rows)} rows)</h2>{box}'
            f"<table><thead><tr><th>op</th><th>dtypes</th><th>verdict</th><th>calls</th><th>phases</th>"
            f"<th>modules</th><th>where</th><th>evidence</th><th>remedy</th><th>native since</th></tr></thead>"
            f"<tbody>{body}</tbody></table></section>")


def _memory(report: Report) -> str:
    memory = report.memory
    if not memory:
        return ""
    return memory_html(memory)  # the estimate, the Mac sizing table, the live log (html_memory.py)


def _environment(report: Report) -> str:
    record = {"opscan": report.opscan_version, "knowledge base": report.kb_version, **report.assumptions}
    return (f'<section id="environment"><h2>Environment</h2>{_kv(record)}<h2>Where it ran</h2>'
            f"{_kv(report.environment)}</section>")


def _kv(data: dict) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(v if isinstance(v, str) else json.dumps(v))}</td></tr>"
                   for k, v in data.items())
    return f"<table>{rows}</table>"


# the page's sections in page order (the op table through html_sections, which passes its filter choice)
PAGE_SECTIONS = {"header": _header, "summary": _summary, "findings": _findings, "transfers": _transfers,
            "modules": _tree, "ops": _ops, "memory": _memory, "environment": _environment}
