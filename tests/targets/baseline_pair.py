"""Test target for --baseline: the same small model with and without an op that has no MPS kernel.

    opscan tests/targets/baseline_pair.py:build_model --arg take=True
"""

import torch
import torch.nn as nn


class Pair(nn.Module):
    """A linear layer, and optionally torch.take (unsupported on MPS) on its output."""

    def __init__(self, take: bool):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.take = take
        self.register_buffer("index", torch.tensor([3, 2, 1, 0]))

    def forward(self, x):
        y = self.lin(x)
        return torch.take(y, self.index) if self.take else y


def build_model(take: bool = False):
    """The model (with `take` or not) and a batch of 2 x 4 features."""
    torch.manual_seed(0)
    return Pair(take), torch.randn(2, 4)
