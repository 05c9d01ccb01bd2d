"""A Gaussian policy head: torch.distributions.Normal(mean, std).log_prob with argument validation on (the default),
the step issue 38 covers in py_drift.txt: Normal, broadcast_all and Distribution validation differ between releases
(valid.all() before 2.7.0, torch._is_all_true(valid) from it)."""

import torch
from torch import nn


class Gauss(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(4, 2)

    def forward(self, x):
        d = torch.distributions.Normal(self.mu(x), torch.ones(2))
        return -d.log_prob(torch.zeros(3, 2)).sum()


def build():
    return Gauss(), torch.randn(3, 4)
