"""Many tiny parameters (issue 28): the fx pre-pass finds a parameter's name without scanning them all, and a
large step graph is written gzipped, named so in the report, read back whole, byte-identical run to run.

The cost itself (linear in calls: bench/tiny_params.py) is a benchmark's, not a test's: no timed assertion here.
"""

from __future__ import annotations

import gzip
import json

import networkx as nx
import torch
from torch import nn

from conftest import TARGETS
from opscan.cli import main
from opscan.graph import views
from opscan.trace.fxnodes import symbolic

TINY = f"{TARGETS / 'tiny.py'}:build_model"


class _Scalars(nn.Module):
    """Scalars read in a loop, one parameter registered under two names, a nested one, and a buffer."""

    def __init__(self, n: int = 200):
        super().__init__()
        self.scalars = nn.ParameterList([nn.Parameter(torch.full((), float(i))) for i in range(n)])
        self.inner = nn.Linear(8, 8)
        self.tied = self.inner.weight  # a second name for inner.weight, and the first named_parameters() gives
        self.register_buffer("offset", torch.ones(8))

    def forward(self, x):
        for p in self.scalars:
            x = x + p
        return self.inner(x) @ self.tied + self.offset


def test_fx_graph_of_many_parameters_is_torch_fxs_own():
    model = _Scalars()
    graph, info = symbolic(model)
    gm = torch.fx.GraphModule(model, graph)
    reference = torch.fx.symbolic_trace(_Scalars())
    assert info.traced and info.nodes == len(reference.graph.nodes) > 200
    assert gm.code == reference.code  # every get_attr under the name torch.fx's scan gives it
    targets = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert targets[:2] == ["scalars.0", "scalars.1"] and "tied" in targets and "inner.weight" not in targets
    x = torch.randn(2, 8)
    assert torch.equal(gm(x), model(x))


def _scan(out, monkeypatch=None, gzip_above=None) -> dict:
    if monkeypatch is not None:
        monkeypatch.setattr(views, "GZIP_ABOVE", gzip_above)
    assert main([TINY, "-o", str(out), "-q"]) == 0
    return json.loads((out / "report.json").read_text())["graph"]


def test_a_large_step_graph_is_written_gzipped_and_named_so(tmp_path, monkeypatch, capsys):
    plain = _scan(tmp_path / "plain")
    assert plain["files"]["calls"] == "graph.graphml" and (tmp_path / "plain" / "graph.graphml").exists()
    out = tmp_path / "big"
    section = _scan(out, monkeypatch, gzip_above=10)  # the tiny MLP's graph counts as large
    assert section["files"] == {"calls": "graph.graphml.gz", "modules": "modules.graphml"}
    assert not (out / "graph.graphml").exists()
    g = nx.read_graphml(out / "graph.graphml.gz")  # networkx reads the gzipped file as it is
    assert (g.number_of_nodes(), g.number_of_edges()) == (section["nodes"], section["edges"])
    text = gzip.decompress((out / "graph.graphml.gz").read_bytes())
    assert text == (tmp_path / "plain" / "graph.graphml").read_bytes()  # the same GraphML, compressed
    first = (out / "graph.graphml.gz").read_bytes()
    _scan(out)
    assert (out / "graph.graphml.gz").read_bytes() == first  # no time stamp in the gzip header
    monkeypatch.setattr(views, "GZIP_ABOVE", 100_000)
    assert _scan(out)["files"]["calls"] == "graph.graphml"
    assert (out / "graph.graphml").exists() and not (out / "graph.graphml.gz").exists()  # no stale file beside
    capsys.readouterr()
