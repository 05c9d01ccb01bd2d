"""Many tiny parameters (issue 28): the fx pre-pass finds a parameter's name without scanning them all.

The cost itself (linear in calls: bench/tiny_params.py) is a benchmark's, not a test's: no timed assertion here.
"""

from __future__ import annotations

import torch
from torch import nn

from opscan.trace.fxnodes import symbolic


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
    gm, info = symbolic(model)
    reference = torch.fx.symbolic_trace(_Scalars())
    assert info.traced and info.nodes == len(reference.graph.nodes) > 200
    assert gm.code == reference.code  # every get_attr under the name torch.fx's scan gives it
    targets = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert targets[:2] == ["scalars.0", "scalars.1"] and "tied" in targets and "inner.weight" not in targets
    x = torch.randn(2, 8)
    assert torch.equal(gm(x), model(x))
