"""Crafted target for the trust tests (issue 27, item 14): a train_step that iterates a DataLoader with two worker
processes, as many real training loops do. On fake and meta tensors (the memory stage's sizing runs, --fake) its
workers cannot take the tensors: opscan runs the loader in its own process there (opscan/target/loaders.py)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def example_inputs():
    return torch.randn(4, 4), torch.randint(0, 2, (4,))


def train_step(model, optimizer, inputs):
    """One batch from a DataLoader with two workers: forward, loss, backward, step."""
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    for features, labels in DataLoader(data, batch_size=4, num_workers=2):
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
