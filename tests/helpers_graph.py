"""Shared by the graph, transfer, HTML, JUnit and baseline tests: one scan per target per session."""

from __future__ import annotations

import functools

from conftest import EXAMPLES, TARGETS

REL_ATTENTION = f"{EXAMPLES / 'rel_attention.py'}:build_model"
MOVES = f"{TARGETS / 'moves.py'}:build_model"
HEAVY = f"{TARGETS / 'fallback_heavy.py'}:build_model"


@functools.lru_cache(maxsize=None)
def scanned(spec: str, **args):
    """The Report of a predicted scan (fx off: it never changes what is recorded)."""
    from opscan.scan import ScanOptions, scan

    return scan(ScanOptions(spec, args=dict(args), fx=False))


def node_of(report, op: str) -> str:
    """The graph node id of the first call of `op` (display name)."""
    g = report.step_graph
    return min((n for n, d in g.nodes(data=True) if d.get("op") == op), key=lambda n: g.nodes[n]["pos"])
