"""Render stage: the human table (the only module that imports rich).

Layout: a header naming what was predicted for, one summary line per verdict (unknown always shown),
how the calls were decided, with `verbose` every row (its module, the user's line, the rule), the findings — one per
cause, a line of the user's code and a rule (report/findings.py) — as a table whose `path:line` moves to a sub-line
of its own when the width is narrow, and a numbered "why, and what to do" entry per finding (the user's line and its
source text, the ops and calls made there, evidence, source, CPU-side op, the fix, where it belongs upstream), with
`tree=True` the module tree coloured by each module's worst verdict, the CPU<->MPS bytes per step with the
costliest calls, the memory estimate, and the lane with the rows that decided it. The tables' and entries' text is
laid out in render/console_layout.py (no rich); this module colours and prints it.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape as markup_escape
from rich.tree import Tree

from opscan.graph.lanes import is_host_reason
from opscan.opkey import signature_text
from opscan.render.console_layout import finding_entry, findings_table, rows_table
from opscan.render.device_code import device_code_lines
from opscan.report import Report, Row
from opscan.report.where import at_text
from opscan.trust.text import inert_commands, printable
from opscan.units import human_bytes as _bytes
from opscan.verdict import Verdict

LANE_STYLE = {"mac-first": "bold green", "dual-track": "bold yellow", "linux-gpu-first": "bold red"}
STYLE = {
    Verdict.NATIVE: "green", Verdict.UNKNOWN: "yellow", Verdict.CPU_FALLBACK: "dark_orange",
    Verdict.UNSUPPORTED: "red", Verdict.UNSUPPORTED_DTYPE: "red", Verdict.MISMATCH: "magenta",
    Verdict.ERROR: "bold red", Verdict.CRASH: "bold magenta", Verdict.TIMEOUT: "bold magenta",
}


def escape(text: str) -> str:
    """Text of the report for the table, one line: control characters, line breaks and terminal escape sequences
    (in module names, exception texts that came back from a Mac, ...) as visible escapes (opscan/trust/text.py),
    then rich's markup escaped. Every piece of report text goes through here; a section of several lines escapes
    each line (`lines`), so no value can start a line of its own (a GitHub workflow command)."""
    return markup_escape(printable(text, newlines=False))


def escaped_lines(parts) -> str:
    """Lines of report text, each escaped (escape)."""
    return "\n".join(escape(part) for part in parts)


def render_table(report: Report, *, verbose: bool = False, tree: bool = False, width: int = 100,
                 color: bool = False) -> str:
    """The console report as text (ANSI colours only when `color`)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system="standard" if color else None,
                      force_terminal=color, highlight=False, soft_wrap=False)
    console.print(_header(report))
    console.print(_summary(report))
    for section in (_decided, _measurement):
        text = section(report)
        if text:
            console.print(text)
    if verbose and report.rows:
        console.print(_markup(_rows(report, width)), overflow="fold")
    findings = report.findings
    if findings:
        console.print(_findings_line(report), overflow="fold")
        console.print(_markup(findings_table(findings, width)), overflow="fold")
        console.print("\nWhy, and what to do:")
        for number, finding in enumerate(findings, 1):
            console.print(_markup(finding_entry(number, finding, report.rows)), overflow="fold")
    elif report.rows:
        console.print(f"All {len(report.rows)} rows are native" + ("." if verbose else " (-v lists them)."))
    if tree:
        console.print(_module_tree(report))
    for section in (_transfers, _memory, _upgrade, _device_code):
        text = section(report)
        if text:
            console.print(text, overflow="fold")
    console.print(_lane(report), overflow="fold")
    console.print(_next(report), overflow="fold")
    return inert_commands(buf.getvalue())  # a cell folded at `::` starts no workflow command


def _markup(lines) -> str:
    """Segments (render/console_layout.py) as rich markup: every text escaped, a verdict's colour where asked."""
    return "\n".join("".join(escape(text) if style is None else f"[{STYLE[Verdict(style)]}]{escape(text)}[/]"
                              for text, style in line) for line in lines)


def _findings_line(report: Report) -> str:
    findings, rows = report.findings, [r for r in report.rows if r.verdict.rank > 0]
    code = sum(1 for f in findings if not f.parts)  # lines that pick a device: no ops of their own
    also = f"; {code} of them a line that picks a device" if code else ""
    return (f"Findings: {len(findings)} cause{'s' * (len(findings) != 1)} (a line of your code and a rule; "
            f"{len(rows)} of {len(report.rows)} ops, {sum(r.calls for r in rows)} calls{also}), most severe first")


def _rows(report: Report, width: int):
    """-v: every row, the disagreeing ones first, then by module and worst verdict."""
    rows = _ordered(report.rows)
    # measured on MPS: the verdict column is measured and the prediction sits beside it; on cpu/cuda the reverse
    measured = None
    if any(r.measured for r in rows):
        measured = "predicted" if any(r.predicted for r in rows) else "measured"
    rules = [r.evidence.rule + (f" (CPU trace: {r.cpu_op.display})" if r.cpu_op else "") for r in rows]
    places = [at_text(r.where[0]) + (f" (+{len(r.where) - 1})" if len(r.where) > 1 else "") if r.where else ""
              for r in rows]
    return rows_table(rows, width, measured, [_modules(r) for r in rows], places, rules)


def _header(report: Report) -> str:
    a = report.assumptions
    what = "training step" if report.trace.get("step") == "train" else "inference forward"
    fx = report.trace.get("fx", {})
    fx_line = "fx graph: traced" if fx.get("traced") else f"fx graph: not traced ({fx.get('reason')})"
    return escaped_lines((
        f"opscan {report.opscan_version} · {report.model} · {what} · {report.mode} for torch "
        f"{a.get('torch_release')} (installed {a.get('installed_torch')})",
        f"{report.trace.get('calls', 0)} calls traced ({report.trace.get('bookkeeping_calls', 0)} bookkeeping"
        f"{_view_calls(report)}) · "
        f"phases: {_phases(report)} · {fx_line}",
    ))


def _view_calls(report: Report) -> str:
    n = report.trace.get("mps_view_calls")
    return f", {n} as MPS dispatches them" if n is not None else ""


def _phases(report: Report) -> str:
    return ", ".join(f"{phase} {counts['calls']}" for phase, counts in report.phases.items())


def _summary(report: Report) -> str:
    parts = []
    for name, counts in report.summary.items():
        if counts["ops"] or name in ("native", "unknown"):
            parts.append(f"{name} {counts['ops']} ops/{counts['calls']} calls")
    return "Summary: " + " · ".join(parts)


def _decided(report: Report) -> str:
    by = report.trace.get("decided_by") or {}
    if not by:
        return ""
    return (f"Calls decided by a direct MPS kernel entry {by.get('kernel', 0)} · by another rule "
            f"{by.get('rule', 0)} · left unknown {by.get('unknown', 0)}")


def _measurement(report: Report) -> str:
    """Measured mode: where the probes ran and what they found (cpu/cuda never stand in for MPS)."""
    m = report.measurement
    if not m:
        return ""
    where = m["device"] if m.get("stands_for_mps") else f"{m['device']} (not MPS: verdicts stay predicted)"
    outcomes = " · ".join(f"{k} {v}" for k, v in m.get("outcomes", {}).items() if v)
    shapes = m["shapes"]
    cap = f"capped at {shapes['max_elements']} elements" if shapes["policy"] == "capped" else "full"
    n = len(m.get("disagreements", []))
    differ = (f"{n} disagree with the prediction" if m.get("stands_for_mps") else
              f"{n} differ from the MPS prediction, as {m['device']} is not MPS")
    lines = [f"Measured on {where}: {m['probes']} probes for {m['calls']} calls · {outcomes} · "
             f"{differ} · shapes {cap}{' — they differ here:' if n else ''}"]
    lines += [f"  ≠ {_differs(row)}" for row in report.rows if row.disagrees]
    return escaped_lines(lines)


def _differs(row: Row) -> str:
    """A row whose measurement differs from its prediction: where, both verdicts, and what the measurement saw."""
    predicted = row.predicted["verdict"] if row.predicted else row.verdict.value
    place = f" at {at_text(row.where[0])}" if row.where and row.where[0].get("file") else ""
    return (f"{row.op.display} [{signature_text(row.dtypes)}]{place}: predicted {predicted}, measured "
            f"{row.measured['verdict']} on {row.measured['device']} — {row.measured.get('text', '')}")


def _ordered(rows) -> tuple[Row, ...]:
    return tuple(sorted(rows, key=lambda r: (not r.disagrees, r.modules[0] if r.modules else "", -r.verdict.rank)))


def _modules(row: Row) -> str:
    first = row.modules[0] if row.modules else ""
    first = first or "(model)"
    return first if len(row.modules) <= 1 else f"{first} (+{len(row.modules) - 1})"


def _module_tree(report: Report) -> Tree:
    worst: dict[str, Verdict] = {}
    ops: dict[str, int] = {}  # rows, not calls: a row's calls are not split by module
    for row in report.rows:
        for prefix in {p for module in row.modules for p in _prefixes(module)}:
            if prefix not in worst or row.verdict.rank > worst[prefix].rank:
                worst[prefix] = row.verdict
            ops[prefix] = ops.get(prefix, 0) + 1
    root = Tree(_tree_label(escape(report.model_name), "", worst, ops))
    nodes = {"": root}
    for path, kind in report.modules:
        if not path:
            continue
        parent = nodes.get(path.rpartition(".")[0], root)
        label = escape(f"{path.rpartition('.')[2]} ({kind})")
        nodes[path] = parent.add(_tree_label(label, path, worst, ops))
    return root


def _prefixes(module: str):
    yield ""
    parts = module.split(".") if module else []
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def _tree_label(name: str, path: str, worst, ops) -> str:
    verdict = worst.get(path)
    if verdict is None:
        return name
    return f"{name} [{STYLE[verdict]}]{verdict.value}[/] ({ops.get(path, 0)} ops incl. children)"


def _upgrade(report: Report) -> str:
    """The smallest upgrade that makes the whole step native (predict/history.py); empty when none was looked at."""
    advice = report.upgrade or {}
    if not advice.get("checked") or (not advice.get("target") and not advice.get("blocking")):
        return ""
    return escape(f"Upgrade: {advice['text']}")


def _transfers(report: Report) -> str:
    """Bytes and syncs between the CPU and MPS per step (transfers.py), and the costliest calls; empty when none."""
    t = report.transfers or {}
    step = t.get("step") or {}
    if not step.get("bytes") and not step.get("syncs"):
        return ""
    parts = [f"{kind} {_bytes(t[kind]['bytes'])}" for kind in ("fallback", "explicit", "implicit")
             if (t.get(kind) or {}).get("bytes")]
    lines = [f"CPU<->MPS per step ({t.get('source', 'predicted')}): {_bytes(step['bytes'])} in {step['syncs']} syncs "
             f"(to host {_bytes(step['d2h_bytes'])}, to MPS {_bytes(step['h2d_bytes'])}; {', '.join(parts) or 'none'})"]
    lines += [f"  {r['op']} in {r['module'] or '(model)'} ({r['phase']}): {_bytes(r['bytes'])}, {r['syncs']} syncs"
              for r in (t.get("ranking") or [])[:3]]
    return escaped_lines(lines)


def _memory(report: Report) -> str:
    """The memory section's line (opscan/memory/section.py), the largest batches, bfloat16 and the live log."""
    m = report.memory
    if not m:
        return ""
    peak = m["estimate"]["peak"]
    lines = [f"Memory (estimate): {m['line']} · at {peak['module'] or '(model)'} in {peak['phase']} ({peak['op']})"]
    lines += [f"  {text}" for text in (m.get("batch_line"), (m.get("bfloat16") or {}).get("note")) if text]
    live = m.get("live")
    if live:
        lines.append(f"Memory live on {live['device']}, {live['iterations']} iterations: {live['growth']['text']}")
        lines += [f"  kept: {s['op']} ({s['phase']}) {s['dtype']}{s['shape']} x{s['count']}, {s['bytes']} B"
                  for s in live["suspects"][:3]]
        lines += [f"  {live['hint']}"] if live.get("hint") else []
    return escaped_lines(lines)


def _device_code(report: Report) -> str:
    """The user's code that picks a device (render/device_code.py), escaped."""
    return escaped_lines(device_code_lines(report))


def _lane(report: Report) -> str:
    hosts = [r.text for r in report.lane.why if is_host_reason(r)]  # the placement model's: on the lane's line
    colour = LANE_STYLE.get(report.lane.name, "bold")
    lines = [f"Lane ({report.mode}): [{colour}]{escape(report.lane.name)}[/]"
             + (f" — {escape(hosts[0])}" if hosts else "")]
    reasons = [r.text for r in report.lane.why if not is_host_reason(r)]
    lines += [f"  - {escape(r.split(': ', 1)[0])}" for r in reasons[:10]]
    if len(reasons) > 10:
        lines.append(f"  … and {len(reasons) - 10} more rows (see report.json)")
    return "\n".join(lines)


def _next(report: Report) -> str:
    """What to do next: confirm a prediction on a Mac, and turn findings into upstream reports."""
    lines = []
    if report.mode == "predicted":
        lines.append("Next: these verdicts are predicted. On a Mac, `opscan TARGET` measures every call and `opscan "
                     "accept TARGET` runs the real step against the CPU; `opscan bundle TARGET` packs the probes for "
                     "a Mac you reach over SSH.")
    worth = sum(1 for f in report.findings if f.upstream.issue)
    if report.findings and report.repro is None:
        lines.append(f"`--repro` writes a standalone script per call and an ISSUE.md for each of the {worth} findings "
                     "worth reporting to PyTorch." if worth else "`--repro` writes a standalone script per call; no "
                     "finding here is for a new PyTorch issue (each one's upstream line says where it belongs).")
    return escaped_lines(lines)
