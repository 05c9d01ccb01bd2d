"""Steps that meet the conditions of known MPS silent-correctness bugs (tests/test_silent_bugs.py): each factory
builds a small model whose training step makes the call an entry of opscan/knowledge/silent_bugs.yaml is about."""

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet18


class SliceIntoNorm(nn.Module):
    """torchvision's ResNet-18 stem, with the batch sliced before its batch norm (bn(x[1:]): storage offset)."""

    def __init__(self):
        super().__init__()
        net = resnet18(num_classes=4)
        self.conv1, self.bn1, self.relu = net.conv1, net.bn1, net.relu

    def forward(self, x):
        return self.relu(self.bn1(self.conv1(x)[1:]))


class SlicedWeight(nn.Module):
    """A linear whose weight is every other row of a larger parameter (non-contiguous)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return F.linear(x, self.table[::2])


class Denoiser(nn.Module):
    """An EDM-style step: x * sigmas[i], with the schedule a plain CPU attribute model.to('mps') leaves behind."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)
        self.sigmas = torch.linspace(1.0, 0.1, 10)

    def forward(self, x):
        return self.net(x * self.sigmas[3])


class ScheduleInStep(nn.Module):
    """The same, with the schedule made inside the step by a factory without device= (a CPU tensor on a Mac)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)

    def forward(self, x):
        sigmas = torch.linspace(1.0, 0.1, 10)
        return self.net(x * sigmas[3])


class OnDevice(nn.Module):
    """Control: the schedule is a buffer, moved to MPS with the model: no CPU tensor meets an MPS one."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)
        self.register_buffer("sigmas", torch.linspace(1.0, 0.1, 10))

    def forward(self, x):
        return self.net(x * self.sigmas[3])


class ColumnXor(nn.Module):
    """An in-place xor on a column view (x[:, 0] ^= 3): the op writes a non-contiguous tensor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, bits):
        bits = bits.clone()
        bits[:, 0] ^= 3
        return self.lin(x) + bits.float()


class LongBmm(nn.Module):
    """Attention scores of 65537 sequences of 256 tokens: q @ k^T has 65537*256*256 > 2**32 elements, k^T a view."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, q):
        k = self.proj(q)
        return torch.bmm(q, k.transpose(1, 2))


def slice_into_norm():
    return SliceIntoNorm(), torch.randn(3, 3, 32, 32)


def sliced_weight():
    return SlicedWeight(), torch.randn(4, 8)


def denoiser():
    return Denoiser(), torch.randn(4, 8)


def schedule_in_step():
    return ScheduleInStep(), torch.randn(4, 8)


def on_device():
    return OnDevice(), torch.randn(4, 8)


def column_xor():
    return ColumnXor(), (torch.randn(3, 4), torch.randint(0, 8, (3, 4), dtype=torch.int16))


def long_bmm():
    return LongBmm(), torch.randn(65537, 256, 64)
