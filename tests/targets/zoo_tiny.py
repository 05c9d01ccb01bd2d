"""Tiny models for `opscan zoo`'s tests (tests/test_zoo_command.py): one that scans, one whose factory raises,
one whose worker dies mid-build, one that never finishes building."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn


class Roll(nn.Module):
    """torch.roll by one along the last dimension (its backward rolls back: the same op)."""

    def forward(self, x):
        return x.roll(1, -1)


def mlp(width: int = 4):
    """Linear-ReLU-roll-Linear trained with AdamW: every op has an MPS kernel from 2.1.0 on (see the test)."""
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), Roll(), nn.Linear(width, 2)), torch.randn(2, 8)


def broken():
    raise RuntimeError("this factory is broken on purpose")


def crash():
    """The worker dies as if segfaulted (SIGKILL: no handler, no core file)."""
    os.kill(os.getpid(), signal.SIGKILL)


def hang():
    """Never returns (the pool's --timeout stops it)."""
    while True:
        time.sleep(1)
