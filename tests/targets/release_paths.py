"""Test targets whose C++ composites call other ops in older releases (tests/test_release_paths.py;
opscan/knowledge/composite_callees.txt says which).

`bce_logits`: F.binary_cross_entropy_with_logits as the loss (its kernel called neg, clamp_min_, exp_, log_ until 2.2.2
and log_sigmoid from 2.3.0). `one_hot`: F.one_hot of the targets inside the loss (min before 2.13, aminmax since).
`rms_norm`: nn.RMSNorm trained (its kernel calls _fused_rms_norm from 2.8.0). `group_norm`: nn.GroupNorm
(contiguous until 2.13.0).
"""

import torch
import torch.nn.functional as F
from torch import nn

_SEED = torch.Generator().manual_seed(0)


def bce_logits():
    """A Linear(8, 1) scored with BCE-with-logits against ones."""
    return nn.Linear(8, 1), torch.randn(4, 8, generator=_SEED)


def loss_fn(outputs, inputs):
    """BCE-with-logits for a (N, 1) output; one-hot MSE for a (N, 5) output; else the sum."""
    if outputs.dim() == 2 and outputs.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(outputs, torch.ones_like(outputs))
    if outputs.dim() == 2 and outputs.shape[1] == 5:
        target = F.one_hot(torch.tensor([0, 1, 2, 3], device=outputs.device), 5).to(outputs.dtype)
        return F.mse_loss(outputs, target)
    return outputs.sum()


def one_hot():
    """A Linear(8, 5) scored against one-hot targets."""
    return nn.Linear(8, 5), torch.randn(4, 8, generator=_SEED)


def rms_norm():
    """nn.RMSNorm(8) after a Linear, trained."""
    return nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8)), torch.randn(4, 8, generator=_SEED)


def group_norm():
    """A conv then nn.GroupNorm(2, 4)."""
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4)), torch.randn(2, 3, 8, 8, generator=_SEED)
