"""Graph stage: views of the step graph — the module-level quotient, each finding's neighbourhood, GraphML.

Pure functions of the graph (and of the transfer accounting); networkx only, no torch.
"""

from __future__ import annotations

from collections import deque
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from opscan.graph.transfers import Cost, Transfers
from opscan.trust.text import xml_text
from opscan.verdict import Verdict

GRAPHML_CALLS = "graph.graphml"
GRAPHML_MODULES = "modules.graphml"
GZIP_ABOVE = 100_000  # nodes + edges: a step graph larger than this is written gzipped (plain text ~300 B each)
RANK = {v.value: v.rank for v in Verdict}
MAX_NEIGHBOURHOODS = 40


def module_graph(g: nx.DiGraph, transfers: Transfers | None = None) -> nx.DiGraph:
    """One node per module ("" is the model itself), one edge per pair of modules a tensor goes between."""
    costs = transfers.by("module") if transfers else {}
    m = nx.DiGraph()
    for _, d in g.nodes(data=True):
        node = m.nodes[d["module"]] if d["module"] in m else _module_node(m, d["module"], costs)
        if d["kind"] == "call":
            node["calls"] += 1
            if RANK.get(d["verdict"], 0) > RANK[node["worst"]]:
                node["worst"] = d["verdict"]
        else:
            node["sources"] += 1
    for u, v, d in g.edges(data=True):
        a, b = g.nodes[u]["module"], g.nodes[v]["module"]
        if a == b:
            m.nodes[a]["internal_bytes"] += d["bytes"]
        elif m.has_edge(a, b):
            m.edges[a, b]["bytes"] += d["bytes"]
            m.edges[a, b]["tensors"] += d["tensors"]
        else:
            m.add_edge(a, b, bytes=d["bytes"], tensors=d["tensors"])
    return m


def _module_node(m: nx.DiGraph, path: str, costs: dict) -> dict:
    cost = costs.get(path, Cost())
    m.add_node(path, label=path or "(model)", calls=0, sources=0, worst="native", internal_bytes=0,
               d2h_bytes=cost.d2h_bytes, h2d_bytes=cost.h2d_bytes, syncs=cost.syncs)
    return m.nodes[path]


def neighbourhood(g: nx.DiGraph, focus: str, radius: int = 2, limit: int = 24) -> list[str]:
    """The focus and the nodes nearest to it (tensor edges either way), at most `limit`, nearest first;
    nodes at one distance in step order (`place`), so identical runs list them identically."""
    seen, order, todo = {focus}, [focus], deque([(focus, 0)])
    while todo and len(order) < limit:
        node, dist = todo.popleft()
        if dist == radius:
            continue
        near = sorted((set(g.predecessors(node)) | set(g.successors(node))) - seen, key=lambda n: place(g, n))
        for other in near[: limit - len(order)]:
            seen.add(other)
            order.append(other)
            todo.append((other, dist + 1))
    return order


def _pos(g: nx.DiGraph, node: str) -> int:
    return g.nodes[node].get("pos", -1)


def place(g: nx.DiGraph, node: str) -> tuple:
    """A total order of the nodes: sources (`s<storage>`, position -1) first by storage number, then calls by
    their position in the step. A set of neighbours is sorted by it, never left in hash order."""
    number = node[1:]
    return _pos(g, node), node[:1], int(number) if number.isdigit() else -1, node


def focus_of(g: nx.DiGraph, row: int, transfers: Transfers | None = None) -> str | None:
    """The call of a row to show: the one with the most transfer bytes, else its first."""
    calls = [n for n, d in g.nodes(data=True) if d["kind"] == "call" and d["row"] == row]
    if not calls:
        return None
    cost = {t.node: t.cost.bytes for t in transfers.nodes} if transfers else {}
    return max(calls, key=lambda n: (cost.get(n, 0), -_pos(g, n)))


def node_dict(g: nx.DiGraph, node: str, costs: dict[str, Cost]) -> dict:
    """One node for the report: call or source, with its transfer cost."""
    d = g.nodes[node]
    cost = costs.get(node, Cost())
    if d["kind"] == "source":
        base = {"label": f"{d['role']} {d['shape'] or 'scalar'}", "verdict": None, "dtypes": d["dtype"]}
    else:
        base = {"label": d["op"], "verdict": d["verdict"], "dtypes": d["dtypes"]}
    return {"id": node, "kind": d["kind"], **base, "module": d["module"], "phase": d["phase"],
            "pos": d.get("pos", -1), "d2h_bytes": cost.d2h_bytes, "h2d_bytes": cost.h2d_bytes,
            "syncs": cost.syncs}


def graph_section(g: nx.DiGraph, transfers: Transfers, findings: list[int]) -> dict:
    """The report's `graph` section: counts of both graphs and the neighbourhood of each finding row."""
    m = module_graph(g, transfers)
    costs = {t.node: t.cost for t in transfers.nodes}
    shown = []
    for row in findings[:MAX_NEIGHBOURHOODS]:
        focus = focus_of(g, row, transfers)
        if focus is None:
            continue
        nodes = neighbourhood(g, focus)
        inside = set(nodes)
        edges = [{"source": u, "target": v, "bytes": d["bytes"], "kind": d["kind"]}
                 for u, v, d in g.subgraph(nodes).edges(data=True) if u in inside]
        shown.append({"row": row, "focus": focus, "nodes": [node_dict(g, n, costs) for n in nodes],
                      "edges": sorted(edges, key=lambda e: (e["source"], e["target"]))})
    calls = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "call")
    return {
        "nodes": g.number_of_nodes(), "edges": g.number_of_edges(), "calls": calls,
        "sources": g.number_of_nodes() - calls,
        "modules": {"nodes": m.number_of_nodes(), "edges": m.number_of_edges()},
        "files": {"calls": calls_file(g), "modules": GRAPHML_MODULES},
        "neighbourhoods": shown,
    }


def calls_file(g: nx.DiGraph) -> str:
    """The call-level GraphML's file name: `graph.graphml`, or `graph.graphml.gz` above GZIP_ABOVE nodes and edges
    (20,000 scalar parameters make 660k: 255 MB of text, 6.5 MB gzipped; nx.read_graphml reads either)."""
    return GRAPHML_CALLS + ".gz" if g.number_of_nodes() + g.number_of_edges() > GZIP_ABOVE else GRAPHML_CALLS


def graphml_text(g: nx.DiGraph, transfers: Transfers | None = None) -> str:
    """GraphML of a graph: its scalar attributes (strings, numbers, booleans), plus each call's copies.

    Written directly in one pass (networkx's writer takes seconds for a 7B step), escaping each distinct text
    once; attribute keys are numbered in order of first appearance. Read back by nx.read_graphml.
    """
    costs = {t.node: t.cost for t in transfers.nodes} if transfers else None
    node_keys: dict = {}  # attribute name -> (its <data> tag, GraphML type), in order of first appearance
    edge_keys: dict = {}
    texts: dict = {}  # value -> its escaped text
    names: dict = {}  # node -> its quoted id
    body = [f"<node id={_quoted(n, names)}>{_data(_node_attrs(n, d, costs), node_keys, 'n', texts)}</node>"
            for n, d in g.nodes(data=True)]
    body += [f"<edge source={_quoted(u, names)} target={_quoted(v, names)}>{_data(d, edge_keys, 'e', texts)}"
             "</edge>" for u, v, d in g.edges(data=True)]
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">']
    out += [f'<key id="n{i}" for="node" attr.name={quoteattr(xml_text(k))} attr.type="{t}"/>'
            for i, (k, (_, t)) in enumerate(node_keys.items())]
    out += [f'<key id="e{i}" for="edge" attr.name={quoteattr(xml_text(k))} attr.type="{t}"/>'
            for i, (k, (_, t)) in enumerate(edge_keys.items())]
    out.append('<graph edgedefault="directed">')
    out += body
    out += ["</graph>", "</graphml>", ""]
    return "\n".join(out)


def _node_attrs(node: str, d: dict, costs: dict | None) -> dict:
    if costs is None or d.get("kind") != "call":
        return d
    c = costs.get(node, Cost())
    return {**d, "d2h_bytes": c.d2h_bytes, "h2d_bytes": c.h2d_bytes, "d2h_syncs": c.d2h_syncs,
            "h2d_syncs": c.h2d_syncs}


_TYPES = {bool: "boolean", int: "long", float: "double", str: "string"}
_SCALARS = (str, int, float, bool)


def _data(attrs: dict, keys: dict, prefix: str, texts: dict) -> str:
    """The <data> elements of one node or edge: its scalar attributes only, new keys numbered as they come."""
    parts = []
    for k, v in attrs.items():
        kind = type(v)
        if kind not in _TYPES and not isinstance(v, _SCALARS):
            continue
        tag = keys.get(k)
        if tag is None:
            tag = keys[k] = (f'<data key="{prefix}{len(keys)}">', _TYPES.get(kind, "string"))
        text = texts.get((kind, v))  # keyed by type too: True == 1 == 1.0 but each reads differently
        if text is None:
            text = texts[(kind, v)] = _value(v)
        parts.append(f"{tag[0]}{text}</data>")
    return "".join(parts)


def _quoted(node, names: dict) -> str:
    text = names.get(node)
    if text is None:
        text = names[node] = quoteattr(xml_text(node))
    return text


def _value(v) -> str:
    """A <data> element's text: characters XML 1.0 forbids (a control character in a module name) written as
    visible escapes (opscan/trust/text.py), then escaped."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return escape(xml_text(v))
