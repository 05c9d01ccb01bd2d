"""Test target: explicit host moves in user code (`.item()`, `.cpu()`, `.tolist()`, printing) — each a
device-to-host copy on MPS —, host work on the copy (not a transfer), and a tensor made from Python data on
the device (built on the host, then copied: 16 bytes host -> device)."""

import torch
import torch.nn as nn


class Moves(nn.Module):
    """A linear layer whose output is read back to the host four ways."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)  # float32[2, 4]: 32 bytes
        self.seen = y.sum().item()  # 4 bytes
        host = y.cpu()  # 32 bytes
        self.values = y.tolist()  # 32 bytes
        self.text = f"{y}"  # printing: 32 bytes
        self.host_total = host.sum()  # host work on the copy: no transfer
        weights = torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)  # Python data: built on the host, copied
        return y * weights


def build_model():
    """The model and one batch of 2 x 4 features."""
    torch.manual_seed(0)
    return Moves(), torch.randn(2, 4)
