"""A module-level tensor the user's own script moves to the device before training (outside the step opscan runs),
told with the `device_tensors` hook (tests/test_placement.py)."""

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = torch.tensor([3, 1])  # the real script runs TARGETS = TARGETS.to(device) before training


def build():
    return nn.Linear(4, 5), torch.randn(2, 4)


def loss_fn(outputs, inputs):
    return F.cross_entropy(outputs, TARGETS)


def device_tensors(model, inputs):
    return [TARGETS]
