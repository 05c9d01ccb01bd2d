"""One line of the step that makes many ops, for the findings tests (issue 35): `torch.sinh(h) * torch.cosh(h)`
dispatches sinh and cosh in the forward, and cosh and sinh again in their backward — four calls of two ops, all
from the line marked below, which a simulated MPS that gets both wrong measures as one cause. A second line casts to
float64 (a documented MPS limitation: a finding, but no upstream report)."""

import torch
import torch.nn as nn


class OneCause(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        h = x * self.scale
        y = torch.sinh(h) * torch.cosh(h)  # the one bad line
        return (y.double() * 2).float()  # float64: documented, never filed


def build_model():
    torch.manual_seed(0)
    return OneCause(), torch.randn(4, 8)
