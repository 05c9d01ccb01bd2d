"""Test target: a tiny model that runs `torch.take` (no MPS kernel) on the same activation eight times,
so the CPU fallback moves more bytes per step than the step's parameters and activations."""

import torch
import torch.nn as nn


class Gather(nn.Module):
    """Eight gathers of one activation through one index buffer."""

    def __init__(self, n: int = 256):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("index", torch.arange(n).flip(0))

    def forward(self, x):
        y = x * self.scale
        out = [torch.take(y, self.index) for _ in range(8)]
        return torch.stack(out).sum(0)


def build_model():
    """The model and an input of 256 floats."""
    torch.manual_seed(0)
    return Gather(), torch.randn(256)
