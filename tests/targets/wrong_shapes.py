"""Test target whose example inputs do not fit the model: 7 features into a Linear(4, 2)."""

import torch
from torch import nn


def build_model():
    """Linear(4, 2) returned with a (3, 7) batch: the first matmul fails."""
    return nn.Linear(4, 2), torch.randn(3, 7)
