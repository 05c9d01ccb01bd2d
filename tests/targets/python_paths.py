"""Test targets for the releases' own Python code paths (tests/test_release_paths.py, opscan/predict/python_paths.py).

Each builder is a tiny model whose step runs one torch Python function whose code differs between releases:
`rpow` (Tensor.__rpow__), `normed` (F.normalize, Tensor.norm), `mha` (F.multi_head_attention_forward with
need_weights=True), `upsample` (F.interpolate bilinear), `custom` (a torch.library.custom_op, from 2.4.0),
`padded` (F.pad: a C binding in 2.0.0-2.1.2, a Python function from 2.2.0), `rms` (F.rms_norm, from 2.4.0) and
`timm_rms` (timm's RmsNorm, which uses F.rms_norm where torch has it and its own code elsewhere).
The step clips the gradients (clip_grad_norm_) before AdamW's step.
"""

import torch
import torch.nn.functional as F
from torch import nn


@torch.library.custom_op("opscan_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    """2 * x, as a custom op (torch.library.custom_op exists from torch 2.4.0)."""
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


double.register_autograd(lambda ctx, grad: grad * 2)


class _Net(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(4, 4)
        self.attn = nn.MultiheadAttention(4, 2) if kind == "mha" else None
        self.conv = nn.Conv2d(1, 1, 1) if kind == "upsample" else None
        if kind == "timm_rms":
            from timm.layers import RmsNorm

            self.norm = RmsNorm(4)

    def forward(self, x):
        if self.kind == "upsample":
            return F.interpolate(self.conv(x), scale_factor=2, mode="bilinear")
        y = self.proj(x)
        if self.kind == "rpow":
            return 2.0 ** y
        if self.kind == "normed":
            return F.normalize(y, dim=-1) * y.norm()
        if self.kind == "custom":
            return double(y)
        if self.kind == "padded":
            return F.pad(y, (1, 1))
        if self.kind == "rms":
            return F.rms_norm(y, (4,))
        if self.kind == "timm_rms":
            return self.norm(y)
        out, _ = self.attn(y, y, y)  # need_weights=True: nn.MultiheadAttention's default
        return out


def rpow():
    return _Net("rpow"), torch.randn(3, 4)


def normed():
    return _Net("normed"), torch.randn(3, 4)


def mha():
    return _Net("mha"), torch.randn(3, 2, 4)


def upsample():
    return _Net("upsample"), torch.randn(1, 1, 4, 4)


def custom():
    return _Net("custom"), torch.randn(3, 4)


def padded():
    return _Net("padded"), torch.randn(3, 4)


def rms():
    return _Net("rms"), torch.randn(3, 4)


def timm_rms():
    return _Net("timm_rms"), torch.randn(3, 4)


def train_step(model, optimizer, inputs):
    """Forward, sum, backward, clip the gradients' norm to 1, AdamW's step."""
    model(inputs).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
