"""Graph stage: the step graph, its transfers and the lane they help decide, from one verdict per MPS-view call —
what opscan/scan.py runs after the rows are made and before the report is assembled.

`GraphMemo` keeps a trace's graphs by the verdicts and calls they were built from: a scan of the same trace for
another release with the same verdicts and view reuses one (a graph is a function of the trace, its view and the
verdicts alone; opscan/zoo/releases.py scans one trace for every release). No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opscan.verdict import Source


@dataclass(eq=False)
class GraphMemo:
    """A trace's step graphs (each with its transfers in .graph["transfers"]), by (verdicts, view calls)."""

    graphs: dict = field(default_factory=dict)

    def graph(self, trace, view, verdicts):
        """The step graph of `trace` for these verdicts, built once."""
        from opscan.graph.build import build_graph
        from opscan.graph.transfers import account

        # a release's view can differ from another's (predict/release_paths.py, predict/python_paths.py): the calls
        # are part of the key
        key = (tuple(verdicts), tuple((c.index, c.op) for c in view))
        if key not in self.graphs:
            self.graphs[key] = build_graph(trace, view, verdicts)
            self.graphs[key].graph["transfers"] = account(self.graphs[key])  # per-call copies for the GraphML
        return self.graphs[key]


def graph_stage(trace, view, verdicts, rows, memory: dict[str, Any] | None = None,
                source: Source = Source.PREDICTED, memo: GraphMemo | None = None) -> dict[str, Any]:
    """The step graph, its transfers and the lane they help decide, all from `verdicts` (one per MPS-view call,
    predicted or measured as `source` says) and the report's `rows`: the Report's keyword arguments."""
    from opscan.graph.lanes import decide_lane, transfer_reasons
    from opscan.graph.transfers import regions, transfer_section
    from opscan.graph.views import graph_section

    g = (memo or GraphMemo()).graph(trace, view, verdicts)
    transfers = g.graph["transfers"]
    findings = sorted((i for i, r in enumerate(rows) if r.verdict.rank > 0), key=lambda i: -rows[i].verdict.rank)
    lane = decide_lane(rows, transfer_reasons(transfers, rows), (memory or {}).get("lane"), source)
    return {"lane": lane, "step_graph": g,
            "graph": {**graph_section(g, transfers, findings), "source": source.value},
            "transfers": {**transfer_section(transfers, regions(g, transfers)), "source": source.value}}
