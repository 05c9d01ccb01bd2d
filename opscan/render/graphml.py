"""Render stage: the step graph and its module-level quotient as GraphML (the CLI writes both files).

`graph.graphml`: one node per MPS-view call (op, verdict, phase, module, dtypes, shapes, bytes in/out, copies
to and from the host) and per source tensor (parameter, input, constant), one edge per producer -> consumer
pair (bytes, tensors, kind). `modules.graphml`: one node per module (calls, worst verdict, copies), one edge
per pair of modules a tensor goes between. Both read by networkx, Gephi, yEd, Cytoscape.
"""

from __future__ import annotations

from opscan.graph.views import GRAPHML_CALLS, GRAPHML_MODULES, graphml_text, module_graph
from opscan.report import Report


def render_graphml(report: Report, **_) -> str:
    """The call-level step graph ('' when the report carries no graph)."""
    g = report.step_graph
    return graphml_text(g, g.graph.get("transfers")) if g is not None else ""


def render_module_graphml(report: Report, **_) -> str:
    """The module-level quotient graph ('' when the report carries no graph)."""
    g = report.step_graph
    return graphml_text(module_graph(g, g.graph.get("transfers"))) if g is not None else ""


GRAPHML_FILES = {GRAPHML_CALLS: render_graphml, GRAPHML_MODULES: render_module_graphml}
