"""Render stage: the step graph and its module-level quotient as GraphML (the CLI writes both files).

`graph.graphml` (gzipped as `graph.graphml.gz` when the graph is large: graph/views.py `calls_file`): one node per
MPS-view call (op, verdict, phase, module, dtypes, shapes, bytes in/out, copies
to and from the host) and per source tensor (parameter, input, constant), one edge per producer -> consumer
pair (bytes, tensors, kind). `modules.graphml`: one node per module (calls, worst verdict, copies), one edge
per pair of modules a tensor goes between. Both read by networkx, Gephi, yEd, Cytoscape.
"""

from __future__ import annotations

import gzip

from opscan.graph.views import GRAPHML_CALLS, GRAPHML_MODULES, graphml_text, module_graph
from opscan.report import Report

GZIP_LEVEL = 6  # zlib's default: 255 MB of GraphML (20,000 scalar parameters) to 6.5 MB


def render_graphml(report: Report, **_) -> str:
    """The call-level step graph ('' when the report carries no graph)."""
    g = report.step_graph
    return graphml_text(g, g.graph.get("transfers")) if g is not None else ""


def render_module_graphml(report: Report, **_) -> str:
    """The module-level quotient graph ('' when the report carries no graph)."""
    g = report.step_graph
    return graphml_text(module_graph(g, g.graph.get("transfers"))) if g is not None else ""


CALLS_NAMES = (GRAPHML_CALLS, GRAPHML_CALLS + ".gz")  # what the call-level file is named, plain or gzipped
GRAPHML_FILES = {"calls": render_graphml, "modules": render_module_graphml}  # the keys of `graph.files`


def graphml_files(report: Report) -> dict[str, str | bytes]:
    """File name -> content of both GraphML files, named as the report's `graph.files` says: a name ending in
    `.gz` gets the text gzipped, byte-identical for identical reports (no time stamp). {} without a graph."""
    if report.step_graph is None:
        return {}
    names = (report.graph or {}).get("files") or {"calls": GRAPHML_CALLS, "modules": GRAPHML_MODULES}
    out: dict[str, str | bytes] = {}
    for key, name in names.items():
        text = GRAPHML_FILES[key](report)
        out[name] = gzip.compress(text.encode(), GZIP_LEVEL, mtime=0) if name.endswith(".gz") else text
    return out
