"""Example target: a transformer block whose attention has one op without an MPS kernel.

The attention adds a relative-position bias gathered from a learned table with `torch.take`. MPS has no
kernel for `aten::take` (nor for `aten::put_`, which its backward runs), so with
PYTORCH_ENABLE_MPS_FALLBACK=1 both run on the CPU: every step copies the table, the index buffer and the
gradient to the host and the results back. opscan's transfer accounting and HTML report show where.

Sizes are small on purpose (dim 32, 2 heads, 8 tokens, batch 2) so the bytes can be checked by hand
(tests/test_transfers.py).

    opscan examples/rel_attention.py:build_model -f html > report.html
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HEADS, SEQ, BATCH = 32, 2, 8, 2


class RelPosAttention(nn.Module):
    """Multi-head self-attention with a learned relative-position bias per head."""

    def __init__(self, dim: int = DIM, heads: int = HEADS, seq: int = SEQ):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn(heads, 2 * seq - 1) * 0.02)
        pos = torch.arange(seq)
        rel = pos[:, None] - pos[None, :] + seq - 1  # (seq, seq) offsets in [0, 2*seq-2]
        index = rel[None] + torch.arange(heads)[:, None, None] * (2 * seq - 1)  # into the flattened table
        self.register_buffer("rel_index", index)  # (heads, seq, seq) int64

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        bias = torch.take(self.bias_table, self.rel_index)  # no MPS kernel: the CPU fallback
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    """Pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RelPosAttention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RelAttentionNet(nn.Module):
    """One block and a linear head over the mean token."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        self.block = Block(dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        return self.head(self.block(x).mean(dim=1))


def build_model():
    """The model and one batch of token features (2 sequences of 8 tokens, dim 32)."""
    torch.manual_seed(0)
    return RelAttentionNet(), torch.randn(BATCH, SEQ, DIM)
