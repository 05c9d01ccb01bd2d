"""A loss that closes over a weight tensor made when the file was imported (tests/test_placement.py)."""

import torch
from torch import nn


def _weighted():
    weights = torch.tensor([1.0, 2.0, 3.0])

    def loss(outputs, inputs):
        return (outputs * weights).sum()
    return loss


loss_fn = _weighted()


def build():
    return nn.Linear(4, 3), torch.randn(2, 4)
