"""Crafted targets for the trust tests (tests/test_hostile_trust.py, issue 27): names that are paths or escape
sequences, and custom ops the target registers itself (a DataLoader with workers: loader_workers.py)."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

ESCAPES = "\x1b[2J\x1b]0;pwned\x07mod\x01x"  # clear screen, window title, a control character XML 1.0 forbids


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def build():
    """A model whose class is named `..` (a generic factory name: the report is named after the class): its
    default folder must not be reports/.. (the current folder)."""
    cls = type("..", (nn.Module,), {"__init__": _init, "forward": lambda self, x: self.body(x)})
    return cls(), torch.randn(3, 4)


def model():
    """A class named like a path with a control character: `../../etc/x\\x1b` (generic factory name, as above)."""
    cls = type("../../etc/x\x1b", (nn.Module,), {"__init__": _init, "forward": lambda self, x: self.body(x)})
    return cls(), torch.randn(3, 4)


def _init(self):
    nn.Module.__init__(self)
    self.body = _mlp()


def escapes():
    """A module named with terminal escape sequences and a control character."""
    model = nn.Sequential()
    model.add_module(ESCAPES, nn.Linear(4, 4))
    model.add_module("head", nn.Linear(4, 2))
    return model, torch.randn(3, 4)


_LIB = torch.library.Library("trustlab", "DEF")  # the point: the target registers its own ops
_LIB.define("cpu_only(Tensor x) -> Tensor")
_LIB.impl("cpu_only", lambda x: x * 2, "CPU")
_LIB.define("with_mps(Tensor x) -> Tensor")
_LIB.impl("with_mps", lambda x: x * 2, "CPU")
_LIB.impl("with_mps", lambda x: x * 2, "MPS")


class Custom(nn.Module):
    """Calls the target's own ops (a CPU-only one, one with an MPS kernel) and torchvision's compiled nms."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            a = torch.ops.trustlab.cpu_only(x)
            b = torch.ops.trustlab.with_mps(x)
            boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.1]], device=x.device)
            keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8], device=x.device), 0.5)
        return self.fc(x + a + b + keep.sum())


def custom_ops():
    return Custom(), torch.randn(2, 4)
