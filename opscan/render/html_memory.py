"""Render stage: the HTML report's memory section, from the report's `memory` dict (pure, no torch).

The headline line, the peak per phase with its categories and module, the Mac sizing table (working
set, hard cap, verdict, largest batch, bfloat16), how the batch was varied, what the estimate does not
count, and with `--memory` the live log (growth across iterations, counters per phase, suspects).
"""

from __future__ import annotations

from opscan.trust.text import html_text as escape

from opscan.units import human_bytes

CATEGORY_NAMES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs")
VERDICT_CLASS = {"fits": "native", "tight": "cpu_fallback", "does_not_fit": "unsupported"}


def memory_html(memory: dict) -> str:
    """The whole <section id="memory">."""
    peak = memory["estimate"]["peak"]
    head = (f'<p class="memory-line"><b>{escape(memory["line"])}</b> — at module {escape(peak["module"] or "(model)")} '
            f'in {escape(peak["phase"])} ({escape(peak["op"])}).</p><p class="small">{escape(memory["basis"])}</p>')
    parts = [head, _phases(memory["estimate"]), _macs(memory), _bf16(memory.get("bfloat16") or {}),
             _scaling(memory.get("batch_scaling") or {}), _not_counted(memory), _live(memory.get("live"))]
    return f'<section id="memory"><h2>Memory</h2>{"".join(p for p in parts if p)}</section>'


def _phases(estimate: dict) -> str:
    head = "".join(f"<th>{escape(c.replace('_', ' '))}</th>" for c in CATEGORY_NAMES)
    rows = "".join(
        f'<tr><td>{escape(name)}</td><td class="num">{human_bytes(p["bytes"])}</td>'
        f'<td>{escape(p["module"] or "(model)")}</td>'
        f'<td>{escape(p["op"])}</td>' + _cells(p["categories"]) + "</tr>" for name, p in estimate["phases"].items())
    return (f'<h3>Peak per phase (steady-state step; first step {human_bytes(estimate["first_step_peak_bytes"])})</h3>'
            f'<table id="memory-phases"><tr><th>phase</th><th>peak</th><th>module</th><th>op</th>{head}</tr>'
            f"{rows}</table>")


def _cells(categories: dict) -> str:
    return "".join(f'<td class="num">{human_bytes(categories[c])}</td>' for c in CATEGORY_NAMES)


def _verdict(v: str) -> str:
    return f'<span class="v v-{VERDICT_CLASS.get(v, "unknown")}">{escape(v.replace("_", " "))}</span>'


def _batch(n, top: int | None) -> str:
    """A largest batch; null is 'beyond the search' when the batch was varied (`top`), else not known."""
    return str(n) if n is not None else (f"≥{top}" if top else "–")


def _macs(memory: dict) -> str:
    top = (memory.get("assumes") or {}).get("max_batch_searched") if (memory.get("batch_scaling") or {}).get(
        "points") else None
    rows = "".join(
        f'<tr data-ram="{m["ram_gb"]}"><td>{m["ram_gb"]} GB</td>'
        f'<td class="num">{human_bytes(m["recommended_bytes"])}</td>'
        f'<td>{m["fraction"]:.3f} ({escape(m["fraction_basis"])})</td>'
        f'<td class="num">{human_bytes(m["hard_cap_bytes"])}</td>'
        f'<td>{_verdict(m["verdict"])}</td><td class="num">{_batch(m["max_batch"], top)}</td>'
        f'<td class="num">{_batch(m["max_batch_under_cap"], top)}</td><td>{_verdict(m["bfloat16"]["verdict"])}</td>'
        f'<td class="num">{_batch(m["bfloat16"]["max_batch"], top)}</td></tr>' for m in memory["macs"])
    assumes = memory.get("assumes") or {}
    return (f'<h3>Which Macs (macOS {escape(str(assumes.get("macos", "?")))} assumed)</h3>'
            f'<table id="memory-macs"><tr><th>Mac</th><th>recommended working set</th><th>fraction of RAM</th>'
            f"<th>hard cap (×{assumes.get('hard_cap_ratio', 1.7)})</th><th>verdict</th><th>largest batch that fits</th>"
            f"<th>largest batch under the cap</th><th>bfloat16</th><th>bfloat16 largest batch</th></tr>{rows}</table>"
            f'<p class="small">fits: peak ≤ {assumes.get("fits_below", 0.9):.0%} of the recommended working set; '
            "tight: above that, under the hard cap and the RAM; does not fit: beyond either. "
            f'Fractions: {escape(str(assumes.get("fraction_rule", "")))}.</p>')


def _bf16(bf16: dict) -> str:
    if not bf16:
        return ""
    blocked = "".join(f"<li>{escape(b)}</li>" for b in bf16.get("blocked_by", []))
    return f"<p>{escape(bf16.get('note', ''))}</p>" + (f"<ul>{blocked}</ul>" if blocked else "")


def _scaling(scaling: dict) -> str:
    points = ", ".join(f'batch {p["batch"]}: {human_bytes(p["peak_bytes"])}' for p in scaling.get("points", []))
    text = (f'The batch ({escape(str(scaling.get("varied", "")))}) was traced at {scaling.get("batch")}; '
            f'sizing runs on {escape(str(scaling.get("method")))} tensors'
            + (f": {escape(points)}" if points else "") + ".")
    return f'<p class="small">{text}{" " + escape(scaling["note"]) if scaling.get("note") else ""}</p>'


def _not_counted(memory: dict) -> str:
    items = "".join(f"<li>{escape(n)}</li>" for n in memory.get("not_counted", []))
    return f'<details><summary>What the estimate does not count</summary><ul>{items}</ul></details>'


def _live(live: dict | None) -> str:
    if not live:
        return ""
    growth = live["growth"]
    names = [k for k in live["samples"][0] if k not in ("iteration", "phase")] if live["samples"] else []
    rows = "".join(f'<tr><td>{s["iteration"]}</td><td>{escape(s["phase"])}</td>'
                   + "".join(f'<td class="num">{s[k]:,}</td>' for k in names) + "</tr>" for s in live["samples"])
    suspects = "".join(f'<tr><td>{escape(s["op"])}</td><td>{escape(s["phase"])}</td><td>{escape(s["dtype"])}'
                       f'{escape(str(s["shape"]))}</td><td class="num">{s["count"]}</td>'
                       f'<td class="num">{s["bytes"]}</td></tr>' for s in live["suspects"])
    return (f'<h3>Live on {escape(live["device"])} ({live["iterations"]} iterations)</h3>'
            f'<p class="{"v v-unsupported" if growth["growing"] else "v v-native"}">{escape(growth["text"])}</p>'
            + (f'<p>{escape(live["hint"])}</p>' if live.get("hint") else "")
            + (f'<table id="memory-suspects"><tr><th>kept tensors made by</th><th>phase</th><th>dtype, shape</th>'
               f"<th>count</th><th>bytes</th></tr>{suspects}</table>" if suspects else "")
            + '<table id="memory-live"><tr><th>iteration</th><th>after</th>'
            + "".join(f"<th>{escape(k)} (bytes)</th>" for k in names) + f"</tr>{rows}</table>")
