"""Test targets whose MPS kernels refuse the call (tests/test_kernel_checks.py).

`lstm_proj`: nn.LSTM(40, 64, num_layers=2, bidirectional=True, proj_size=32) — `_lstm_mps` raises "LSTM with
projections is not currently supported with MPS." (RnnOps.mm); `lstm` is the same LSTM without proj_size.
`unet3d`: a tiny 3-D encoder/decoder with nn.ConvTranspose3d — in float16 or bfloat16 `_mps_convolution_transpose`
raises "ConvTranspose 3D with BF16 or FP16 types is not supported on MPS" (Convolution.mm).
"""

import torch
from torch import nn


class _LSTM(nn.Module):
    """An LSTM whose outputs are summed by the default loss."""

    def __init__(self, proj_size: int = 0):
        super().__init__()
        self.lstm = nn.LSTM(40, 64, num_layers=2, bidirectional=True, proj_size=proj_size)

    def forward(self, x):
        return self.lstm(x)[0]


def lstm_proj():
    """The LSTM with projections and 7 steps of a batch of 3."""
    return _LSTM(proj_size=32), torch.randn(7, 3, 40, generator=torch.Generator().manual_seed(0))


def lstm():
    """The same LSTM without projections."""
    return _LSTM(), torch.randn(7, 3, 40, generator=torch.Generator().manual_seed(0))


class _UNet3d(nn.Module):
    """Conv3d down by 2, ConvTranspose3d back up."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv3d(2, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x):
        return self.up(torch.relu(self.down(x)))


def unet3d():
    """The 3-D model and a 1x2x8x8x8 volume."""
    return _UNet3d(), torch.randn(1, 2, 8, 8, 8, generator=torch.Generator().manual_seed(0))


class _UNet2d(nn.Module):
    """Conv2d down by 2, ConvTranspose2d back up."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)

    def forward(self, x):
        return self.up(torch.relu(self.down(x)))


def unet2d():
    """The 2-D model and a 1x2x8x8 image."""
    return _UNet2d(), torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(0))


def r3d_18():
    """torchvision's R3D-18 video classifier (random weights) and a 1x3x4x32x32 clip: every convolution is
    nn.Conv3d, so `_mps_convolution` gets 5-D input — "Conv3D is not supported on MPS" in torch 2.0-2.2,
    "Conv3D is only supported on MPS for MacOS_13_2 or newer" in 2.3-2.8 (Convolution.mm)."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.video.r3d_18(weights=None, num_classes=10), torch.randn(
        1, 3, 4, 32, 32, generator=torch.Generator().manual_seed(0))
