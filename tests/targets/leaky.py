"""Test target for the live memory log: a training loop that keeps each step's loss.

`build_model(keep="graph")` keeps the loss tensor itself, and with it its autograd graph (backward
already freed the saved activations, so only the loss's own 4 bytes per step are tensor bytes):
memory grows every iteration. `keep="item"` keeps `loss.item()`, a
Python float: nothing grows. The default step (no `keep`) is the AdamW negative control: the optimizer
allocates its state in the first iteration only.
"""

import torch
from torch import nn

LOSSES: list = []
MODE = {"keep": None}


def build_model(keep=None):
    """An MLP 64 -> 256 -> 64 and a batch of 32 rows; `keep` chooses what train_step keeps."""
    MODE["keep"] = keep
    LOSSES.clear()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    return model, torch.randn(32, 64, generator=torch.Generator().manual_seed(0))


def train_step(model, optimizer, inputs):
    """Forward, loss, backward, AdamW step; keeps the loss as `MODE["keep"]` says."""
    loss = model(inputs).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if MODE["keep"] == "graph":
        LOSSES.append(loss)
    elif MODE["keep"] == "item":
        LOSSES.append(loss.item())
