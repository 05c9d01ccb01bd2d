"""Test targets for what-if scans across torch releases (tests/test_coverage.py).

`ctc` trains a tiny acoustic model with F.ctc_loss: `_ctc_loss` got its MPS kernel in 2.14.0.
`embedding_max_norm` uses nn.Embedding(max_norm=...), whose renormalisation (`embedding_renorm_`)
MPSFallback.mm sends to the CPU in every release 2.0-2.14.
`attention` calls F.scaled_dot_product_attention, whose MPS kernel exists from 2.5.0.
"""

import torch
import torch.nn.functional as F
from torch import nn


class _CTC(nn.Module):
    """Linear(8, 5) + log_softmax over 5 classes (blank = 0)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 5)

    def forward(self, x):
        return self.proj(x).log_softmax(-1)


def ctc():
    """The CTC model and 12 frames of a batch of 2."""
    return _CTC(), torch.randn(12, 2, 8, generator=torch.Generator().manual_seed(0))


def loss_fn(outputs, inputs):
    """CTC loss against fixed 3-token targets (for `ctc`), else the sum of the outputs."""
    if outputs.dim() != 3 or outputs.shape[-1] != 5:
        return outputs.sum()
    targets = torch.tensor([[1, 2, 3], [2, 3, 4]], device=outputs.device)  # the lengths may stay on the CPU
    return F.ctc_loss(outputs, targets, torch.tensor([12, 12]), torch.tensor([3, 3]))


def embedding_max_norm():
    """nn.Embedding(10, 4, max_norm=1.0) and 6 token ids."""
    return nn.Embedding(10, 4, max_norm=1.0), torch.tensor([[1, 2, 3], [4, 5, 6]])


class _Attention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention (no dropout)."""

    def forward(self, x):
        return F.scaled_dot_product_attention(x, x, x)


def attention():
    """The attention module and a (1, 2, 4, 8) query; scanned with --inference, MPS runs its own kernel."""
    return _Attention(), torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))


class _TrainedAttention(nn.Module):
    """A linear projection, then self-attention through F.scaled_dot_product_attention with grad."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        q = self.proj(x)
        return F.scaled_dot_product_attention(q, q, q)


def trained_attention():
    """Attention trained: MPS takes the math path (`_scaled_dot_product_attention_math`), whose softmax the
    installed torch runs as `_safe_softmax` (2.5.0+); older releases do not declare it."""
    return _TrainedAttention(), torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))
