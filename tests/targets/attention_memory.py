"""Test target for the memory estimate: one self-attention block whose scores dominate its memory.

Batch 2, 4 heads, 256 tokens, head size 8: with grad, MPS runs attention on its math path, which
materialises the B x H x L x L scores (2 x 4 x 256 x 256 x 4 bytes = 2 MiB per tensor); the CPU's flash
kernel keeps only a B x H x L log-sum-exp. `batch` changes the leading dimension of the input.
"""

import torch
import torch.nn.functional as F
from torch import nn

HEADS, TOKENS, WIDTH = 4, 256, 32


class Attention(nn.Module):
    """qkv projection, scaled-dot-product attention, output projection."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, WIDTH))


def build_model(batch: int = 2):
    """The block and a (batch, 256, 32) input."""
    return Attention(), torch.randn(batch, TOKENS, WIDTH, generator=torch.Generator().manual_seed(0))
