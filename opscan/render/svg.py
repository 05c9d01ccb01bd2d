"""Render stage: one finding's neighbourhood as inline SVG, laid out here (no library, no script).

Layout: one horizontal lane per module (the module context), in model order; inside it, columns by the
longest path from the neighbourhood's sources (so data flows left to right), and calls of one lane and
column stacked. Edges are curves; an edge into or out of a fallback call carries host<->device copies
and is drawn dashed. The finding's own call is outlined (`class="node focus"`).
"""

from __future__ import annotations

from opscan.trust.text import html_text as escape

from opscan.units import human_bytes

COL_W, NODE_W, NODE_H, ROW_H, LABEL_W, PAD = 168, 150, 38, 50, 170, 12
FALLBACK = frozenset({"cpu_fallback", "unsupported"})


def neighbourhood_svg(nb: dict, module_order: dict[str, int], module_types: dict[str, str]) -> str:
    """The `graph.neighbourhoods[i]` entry of a report as an <svg> element."""
    nodes = {n["id"]: n for n in nb["nodes"]}
    ranks = _ranks(nodes, nb["edges"])
    lanes = sorted({n["module"] for n in nodes.values()}, key=lambda m: (module_order.get(m, 1 << 30), m))
    places, lane_boxes = _place(nodes, ranks, lanes)
    width = LABEL_W + (max(ranks.values(), default=0) + 1) * COL_W + PAD
    height = sum(h for _, _, h in lane_boxes) + PAD
    parts = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" data-row="{nb["row"]}" data-focus="{escape(nb["focus"])}" '
             f'data-nodes="{len(nodes)}" role="img" aria-label="neighbourhood of {escape(nb["focus"])}">']
    parts += [_lane(m, top, h, width, module_types) for m, top, h in lane_boxes]
    parts += [_edge(e, places, nodes) for e in nb["edges"] if e["source"] in places and e["target"] in places]
    parts += [_node(n, places[n["id"]], n["id"] == nb["focus"]) for n in nodes.values()]
    parts.append("</svg>")
    return "\n".join(parts)


def _ranks(nodes: dict, edges: list) -> dict[str, int]:
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        if e["source"] in nodes and e["target"] in nodes:
            preds[e["target"]].append(e["source"])
    ranks: dict[str, int] = {}
    for node in sorted(nodes, key=lambda n: (nodes[n]["pos"], n)):  # sources (pos -1) first, then step order
        ranks[node] = max((ranks.get(p, 0) + 1 for p in preds[node] if p in ranks), default=0)
    return ranks


def _place(nodes: dict, ranks: dict, lanes: list[str]):
    places: dict[str, tuple[int, int]] = {}
    boxes, top = [], PAD
    for lane in lanes:
        stacks: dict[int, int] = {}
        for node in sorted((n for n in nodes if nodes[n]["module"] == lane), key=lambda n: (nodes[n]["pos"], n)):
            row = stacks.get(ranks[node], 0)
            stacks[ranks[node]] = row + 1
            places[node] = (LABEL_W + ranks[node] * COL_W, top + PAD + row * ROW_H)
        height = max(stacks.values(), default=1) * ROW_H + PAD
        boxes.append((lane, top, height))
        top += height
    return places, boxes


def _lane(module: str, top: int, height: int, width: int, types: dict[str, str]) -> str:
    name = module or "(model)"
    kind = types.get(module, "")
    return (f'<g class="lane" data-module="{escape(module)}"><rect class="lane-bg" x="0" y="{top}" '
            f'width="{width}" height="{height}"/><text class="lane-label" x="8" y="{top + 20}">'
            f'{escape(_short(name, 24))}</text><text class="lane-type" x="8" y="{top + 36}">{escape(kind)}</text>'
            "</g>")


def _edge(e: dict, places: dict, nodes: dict) -> str:
    (x1, y1), (x2, y2) = places[e["source"]], places[e["target"]]
    x1, y1, y2 = x1 + NODE_W, y1 + NODE_H / 2, y2 + NODE_H / 2
    bend = max(30, (x2 - x1) / 2)
    crossing = any(nodes[n].get("verdict") in FALLBACK for n in (e["source"], e["target"]))
    cls = f'edge kind-{escape(e["kind"])}' + (" crossing" if crossing else "")
    return (f'<path class="{cls}" d="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} '
            f'{x2:.0f},{y2:.0f}"><title>{escape(e["kind"])}: {e["bytes"]} bytes</title></path>')


def _node(n: dict, at: tuple[int, int], focus: bool) -> str:
    x, y = at
    verdict = n.get("verdict") or "source"
    cls = f"node {n['kind']} verdict-{escape(verdict)}" + (" focus" if focus else "")
    label = n["label"].removeprefix("aten::")
    sub = _sub(n)
    title = (f"{n['label']} ({n['dtypes']}) · {verdict} · {n['phase'] or '-'} · {n['module'] or '(model)'}"
             + (f" · to host {n['d2h_bytes']} B, to device {n['h2d_bytes']} B, {n['syncs']} syncs"
                if n["syncs"] else ""))
    mark = ' data-focus="true"' if focus else ""
    return (f'<g class="{cls}" data-id="{escape(n["id"])}" data-verdict="{escape(verdict)}"{mark} '
            f'transform="translate({x},{y})">'
            f'<rect width="{NODE_W}" height="{NODE_H}" rx="{14 if n["kind"] == "source" else 4}"/>'
            f'<text x="6" y="15">{escape(_short(label, 22))}</text>'
            f'<text class="sub" x="6" y="30">{escape(sub)}</text><title>{escape(title)}</title></g>')


def _sub(n: dict) -> str:
    if n["syncs"]:
        return f"⇅ {human_bytes(n['d2h_bytes'] + n['h2d_bytes'])}, {n['syncs']} syncs"
    return f"{n['phase'] or '-'} · {_short(n['dtypes'], 14)}"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
