"""A small model that earns every predicted verdict on MPS (torch 2.14.1), for opscan's tests and docs.

- nn.Embedding(max_norm=1.0): PyTorch renormalises rows with aten::embedding_renorm_, which
  MPSFallback.mm always runs on the CPU → `cpu_fallback`;
- a float64 buffer mixed into the features → float64 ops → `unsupported_dtype`;
- torch.take: no MPS kernel for aten::take, and its backward's aten::put_ has none either →
  `unsupported` (NotImplementedError unless PYTORCH_ENABLE_MPS_FALLBACK=1);
- AdaptiveAvgPool2d((3, 3)) on a 7x7 map: MPS's adaptive pooling needs divisible sizes and raises
  whatever the fallback variable says → `error`;
- a torch.library custom op (tricky::scale): no sourced table says anything about it → `unknown`.

Scan it:  opscan examples/tricky.py:build_model
"""

import torch
import torch.nn as nn


@torch.library.custom_op("tricky::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply by a constant (a stand-in for a user's own kernel)."""
    return x * factor


@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)


def _scale_backward(ctx, grad):
    return grad * ctx.factor, None


def _scale_setup(ctx, inputs, output):
    ctx.factor = inputs[1]


scale.register_autograd(_scale_backward, setup_context=_scale_setup)


class Tricky(nn.Module):
    """Embedding with max_norm, a conv feature map, adaptive pooling, take(), float64 and a custom op."""

    def __init__(self, vocab: int = 50, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, max_norm=1.0)
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((3, 3))
        self.head = nn.Linear(dim + 36, 4)
        self.register_buffer("offsets", torch.linspace(0, 1, 4, dtype=torch.float64))
        self.register_buffer("picks", torch.tensor([0, 5, 9, 14, 20, 27]))

    def forward(self, tokens, image):
        text = self.embed(tokens).mean(dim=1)
        feats = self.pool(self.conv(image)).flatten(1)
        picked = torch.take(feats, self.picks)
        out = self.head(torch.cat([text, feats], dim=1)) + picked.sum()
        out = scale(out, 0.5)
        precise = out.double() + self.offsets  # float64 math: MPS has no float64
        return precise.float()


def build_model():
    """The model and a batch: 2 sequences of 5 tokens, 2 single-channel 7x7 images."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 5))
    image = torch.randn(2, 1, 7, 7)
    return Tricky(), (tokens, image)
