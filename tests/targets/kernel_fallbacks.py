"""Test targets whose MPS kernels run some of the work on the CPU themselves (tests/test_kernel_fallbacks.py).

`mask_upsample`: a linear layer, a bool-mask index of its output (`y[keep]`: index.Tensor expands the mask with
nonzero inside its kernel) and a nearest upsampling by a scale factor — below macOS 13, torch 2.0-2.4's nonzero and
nearest-upsampling kernels send the work to the CPU; 2.5-2.8's nonzero does below macOS 14. `bilinear_scale` /
`bilinear_size`: bilinear upsampling by a scale factor (2.0-2.4 below macOS 13: CPU) and to a size (MPS).
"""

import torch
import torch.nn.functional as F
from torch import nn


class _MaskUpsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        keep = y[:, 0] > 0
        picked = y[keep]
        up = F.interpolate(y.view(1, 1, 8, 8), scale_factor=2, mode="nearest")
        return picked.sum() + up.sum()


def mask_upsample():
    """The masked index and nearest upsampling, with a mask that keeps 5 of 8 rows."""
    model = _MaskUpsample()
    with torch.no_grad():
        model.proj.weight.zero_()
        model.proj.bias.zero_()
        model.proj.bias[0] = 1.0
        model.proj.weight[0, 0] = 1.0
    x = torch.zeros(8, 8)
    x[:, 0] = torch.tensor([1.0, -3.0, 1.0, -3.0, 1.0, -3.0, 1.0, 1.0])  # y[:, 0] = x[:, 0] + 1: 5 rows > 0
    return model, (x,)


class _Bilinear(nn.Module):
    def __init__(self, by_scale: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.by_scale = by_scale

    def forward(self, x):
        y = self.conv(x)
        if self.by_scale:
            return F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return F.interpolate(y, size=(16, 16), mode="bilinear", align_corners=False)


def bilinear_scale():
    """Bilinear upsampling by scale_factor=2."""
    return _Bilinear(True), (torch.randn(2, 3, 8, 8),)


def bilinear_size():
    """Bilinear upsampling to size=(16, 16)."""
    return _Bilinear(False), (torch.randn(2, 3, 8, 8),)


class _GridMedian(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        theta = torch.eye(2, 3, device=y.device).expand(y.shape[0], 2, 3)
        grid = F.affine_grid(theta, list(y.shape), align_corners=False)
        return F.grid_sample(y, grid, align_corners=False).sum() + y.median()


def grid_median():
    """F.grid_sample (grid_sampler_2d: on the CPU below macOS 13.2 in 2.0-2.8) and Tensor.median (below 13.0 in
    2.0-2.4)."""
    return _GridMedian(), (torch.randn(2, 3, 8, 8),)


class _Ranker(nn.Module):
    """A detector-style head: scores, the top-k of them (k=k), and a sort of the kept scores — what SSD's and Faster
    R-CNN's post-processing call (torch.topk, torch.sort)."""

    def __init__(self, k: int):
        super().__init__()
        self.score = nn.Linear(8, 1)
        self.k = k

    def forward(self, x):
        scores = self.score(x).squeeze(-1)
        top, _ = scores.topk(self.k, dim=-1)
        ranked, _ = torch.sort(top, dim=-1, descending=True)
        return ranked.sum()


def topk_sort_k32():
    """topk with k=32 (> 16) and a sort, on 2x64 scores."""
    return _Ranker(32), torch.randn(2, 64, 8, generator=torch.Generator().manual_seed(0))


def topk_sort_k16():
    """topk with k=16 (the largest k 2.0-2.4's MPS kernel keeps below macOS 13) and a sort."""
    return _Ranker(16), torch.randn(2, 64, 8, generator=torch.Generator().manual_seed(0))
