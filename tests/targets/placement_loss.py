"""A classifier whose loss reads a module-level target tensor (tests/test_placement.py): on a Mac the target stays
on the CPU and nll_loss's MPS kernel refuses it (placement_loss_fixed.py moves it first)."""

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = torch.tensor([3, 1])


def build():
    return nn.Linear(4, 5), torch.randn(2, 4)


def loss_fn(outputs, inputs):
    return F.cross_entropy(outputs, TARGETS)
