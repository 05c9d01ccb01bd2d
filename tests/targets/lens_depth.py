"""Test targets for the lens at every depth and for scalar composites (tests/test_lens_depth.py).

`mha`: nn.MultiheadAttention(need_weights=False), whose F.multi_head_attention_forward calls
F.scaled_dot_product_attention (and F.linear) inside its own body.
`encoder`: nn.TransformerEncoder, scanned with --inference (its fast path is a device branch).
`scalars`: the composites called with Python scalars (`%`, `&`, `|`, `^`, fmod, xlogy, copysign).
"""

import torch
from torch import nn


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def mha():
    """MultiheadAttention(64, 4) on a (2, 8, 64) batch, weights not returned (the sdpa path)."""
    return _MHA(), torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0))


def encoder():
    """Two TransformerEncoderLayer(64, 4) on a (2, 8, 64) batch."""
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)
    return nn.TransformerEncoder(layer, 2), torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0))


class _Scalars(nn.Module):
    """Integer ids hashed with %, &, |, ^ (as CANINE and LongT5 do) and float ops with scalar operands."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        ids = torch.arange(8, device=x.device).view(2, 4)  # on the step's device, as a Mac needs it
        hashed = (ids % 3) + (ids & 1) + (ids | 2) + (ids ^ 1)
        y = self.proj(x)
        z = torch.fmod(y, 0.5) + torch.xlogy(y, 2.0) + torch.copysign(y, -1.0)
        return z * hashed


def scalars():
    """The scalar-composite module and a (2, 4) input."""
    return _Scalars(), torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
