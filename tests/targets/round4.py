"""Crafted targets for issue 36 (tests/test_hostile_trust.py's round-4 cases): a factory that takes a credential,
module and class names that try to start GitHub workflow commands, and a class name too wide for a folder."""

from __future__ import annotations

import torch
from torch import nn

FORGED = "x\n::error file=forged,line=1::forged by a module name"  # a line of its own, if printed raw


class Pair(nn.Module):
    """A linear layer, then torch.take (no MPS kernel: a finding, with repro files and predicted transfers)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("index", torch.tensor([3, 2, 1, 0]))

    def forward(self, x):
        return torch.take(self.lin(x), self.index)


def secret(token: str, take: bool = True):
    """A factory whose `token` argument is a credential (it must never reach ISSUE.md or a script)."""
    assert token.startswith("ghp_")
    return Pair(), torch.randn(2, 4)


def forged():
    """The finding's module is named with a line break and a workflow command."""
    model = nn.Sequential()
    model.add_module(FORGED, Pair())
    return model, torch.randn(2, 4)


def model():
    """A class named with 90 four-byte letters: under the sanitiser's 96 characters, over a file system's 255
    bytes (generic factory name: the report folder is named after the class)."""
    cls = type("\U0001d400" * 90, (nn.Module,), {"__init__": _init, "forward": lambda self, x: self.body(x)})
    return cls(), torch.randn(3, 4)


def _init(self):
    nn.Module.__init__(self)
    self.body = nn.Linear(4, 2)
