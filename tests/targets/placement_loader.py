"""A step that iterates a DataLoader of CPU tensors and forgets to move the batches (tests/test_placement.py;
placement_loader_moved.py moves them, as a Mac script does)."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA = TensorDataset(torch.randn(4, 4), torch.randint(0, 3, (4,)))


def build():
    return nn.Linear(4, 3), torch.randn(2, 4)


def train_step(model, optimizer, inputs):
    for x, y in DataLoader(DATA, batch_size=2):
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        break
