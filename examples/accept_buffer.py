"""Crafted target for `opscan accept`: a checkpoint that does not hold everything the model needs.

`RunningScale` divides its input by a running scale kept in a buffer that is updated at every
training forward — registered with `persistent=False`, so `state_dict()` leaves it out. A model
reloaded from the checkpoint starts from the factory's scale (1.0) instead of the trained one, and its
next step differs: `opscan accept` fails the checkpoint round trip and names `norm.scale`.
(Register the buffer with persistent=True and the round trip passes.)

    opscan accept examples/accept_buffer.py:build_model --device cpu
"""

import torch
from torch import nn


class RunningScale(nn.Module):
    """x / scale, where scale follows the mean |x| of the training batches (momentum 0.5)."""

    def __init__(self, persistent: bool):
        super().__init__()
        self.register_buffer("scale", torch.ones(()), persistent=persistent)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.scale.mul_(0.5).add_(0.5 * x.abs().mean())
        return x / self.scale


class Net(nn.Module):
    """Linear, ReLU, the running scale, Linear."""

    def __init__(self, persistent: bool):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = RunningScale(persistent)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def build_model(persistent: bool = False):
    """The net (its scale buffer left out of the state dict unless persistent=True) and a batch of 4."""
    return Net(persistent), torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
