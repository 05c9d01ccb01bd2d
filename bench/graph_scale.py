"""Benchmark: what the step graph adds to a 7B scan (graph, transfers, GraphML, HTML).

Traces examples/llama_big.py at 7B width (32 layers, batch 1 x 2048 tokens) with fake tensors when
opscan.trace.fake is available (`--fake`); otherwise the same 32-layer LLaMA step at tiny width (the same
calls, so the same graph size). Then times each stage that this issue adds and prints their sum last:

    python bench/graph_scale.py [--size 7b|tiny] [--layers N]
    ...
    graph_7b: 3.1 s
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _timed(label: str, fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    took = time.perf_counter() - start
    print(f"{label:<28} {took:7.2f} s", flush=True)
    return out, took


def trace_7b(size: str, layers: int | None):
    """(trace, MPS view, verdicts, rows) of the LLaMA step."""
    from opscan.knowledge import load_knowledge
    from opscan.mps_view import mps_view
    from opscan.predict.calls import predict_call
    from opscan.report import make_row
    from opscan.report.assemble import collect_rows
    from opscan.scan import ScanOptions, run_trace
    from opscan.target.load import load_target

    args = {"size": size, **({"layers": layers} if layers else {})}
    kb = load_knowledge()
    try:
        from opscan.scan import _fake_choice
        options = ScanOptions("examples/llama_big.py:build_model", args=args, fake=size != "tiny", fx=False)
        target = load_target(options.target, args, [], _fake_choice(options))
    except ImportError:  # no fake tensors yet: the same calls at tiny width
        options = ScanOptions("examples/llama_big.py:build_model", args={"size": "tiny", "layers": 32}, fx=False)
        target = load_target(options.target, options.args, [])
    trace, _ = _timed("trace (not this issue)", run_trace, target, options, kb)
    view = mps_view(trace)
    cache: dict = {}
    found = [predict_call(c, kb, cache) for c in view]
    rows = tuple(make_row(use, f) for use, f in collect_rows(view, found))
    return trace, view, [f.verdict for f in found], rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="7b", choices=("7b", "tiny"))
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args()
    trace, view, verdicts, rows = trace_7b(args.size, args.layers)
    print(f"calls traced {len(trace.calls)}, MPS view {len(view)}, rows {len(rows)}")
    from dataclasses import replace

    from opscan.render.graphml import render_graphml, render_module_graphml
    from opscan.render.html import render_html
    from opscan.graph.stage import graph_stage
    from tests.helpers_report import report

    parts, graph_s = _timed("graph stage", graph_stage, trace, view, verdicts, rows)
    g = parts["step_graph"]
    print(f"graph: {g.number_of_nodes()} nodes, {g.number_of_edges()} edges")
    full = replace(report(rows=rows), **parts)
    calls_xml, t1 = _timed("GraphML (calls)", render_graphml, full)
    modules_xml, t2 = _timed("GraphML (modules)", render_module_graphml, full)
    page, t3 = _timed("HTML report", render_html, full)
    print(f"sizes: graph.graphml {len(calls_xml) / 1e6:.1f} MB, modules.graphml {len(modules_xml) / 1e6:.2f} MB, "
          f"report.html {len(page.encode()) / 1e6:.2f} MB")
    print(f"graph_7b: {graph_s + t1 + t2 + t3:.1f} s")


if __name__ == "__main__":
    main()
