"""A crafted target for measured mode: its step tries zeta in float16 and bfloat16 first and falls back to
float32 when that raises (as some libraries do). Neither the CPU nor CUDA has a low-precision zeta
kernel, so probing the recorded low-precision calls on either device must report `unsupported_dtype`
with PyTorch's own text ('"zeta_cpu" not implemented for 'Half'' and the like).

    opscan bench/crafted_low_precision.py:build --device cpu
"""

import torch
from torch import nn


class TryLowPrecision(nn.Module):
    """Linear, then zeta tried in float16 and bfloat16 (outside autograd: zeta has no derivative)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        q = self.lin(x).abs() + 2
        out = q.sum()
        q = q.detach()
        for dtype in (torch.float16, torch.bfloat16):
            low = q.to(dtype)
            try:
                out = out + torch.special.zeta(low, torch.full_like(low, 3.0)).float().sum()
            except (NotImplementedError, RuntimeError):
                out = out + torch.special.zeta(q, torch.full_like(q, 3.0)).sum()
        return out


def build():
    """The model and a batch of three rows."""
    return TryLowPrecision(), torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
