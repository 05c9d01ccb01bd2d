"""Example target: a small classifier whose head runs on the CPU, whatever device the rest of it is on.

The pattern of code that pins one layer to the host (an op the device lacks, a layer too big for it):
`model.to(device)` leaves the head's linear layer on the CPU, and the head's forward copies its input to
the host and its result back — `self.proj(x.cpu()).to(x.device)`. Every step then moves the batch's
features to the host in forward and their gradient back in backward. `opscan accept` reports that
transfer with its bytes and module (`head`) and never gives this model `mac-first`.

Sizes are small so the bytes can be checked by hand (tests/test_accept_placement.py): the head's input
is BATCH x DIM float32 = 8 * 16 * 4 = 512 bytes per step, its output BATCH x CLASSES = 8 * 4 * 4 = 128.

    opscan accept examples/accept_cpu_layer.py:build_model
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HIDDEN, CLASSES, BATCH = 16, 32, 4, 8
TARGETS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])  # one class label per example


class CpuHead(nn.Module):
    """A linear layer kept on the CPU: moving the model moves the rest, not this."""

    def __init__(self, dim: int = DIM, classes: int = CLASSES):
        super().__init__()
        self.proj = nn.Linear(dim, classes)

    def _apply(self, fn, recurse=True):
        return self  # .to(device), .cuda(), .half() ... leave the head where it is: on the CPU

    def forward(self, x):
        return self.proj(x.cpu()).to(x.device)


class CpuLayerNet(nn.Module):
    """A two-layer body on the target device and a head on the CPU."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIM))
        self.head = CpuHead()

    def forward(self, x):
        return self.head(self.body(x))


def build_model():
    """The model with random weights, and a batch of eight 16-feature examples."""
    torch.manual_seed(0)
    return CpuLayerNet(), torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(0))


def loss_fn(outputs, inputs):
    """Cross-entropy of the logits against fixed labels (on the logits' device)."""
    return F.cross_entropy(outputs, TARGETS.to(outputs.device))
