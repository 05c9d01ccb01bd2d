"""Test targets for reports that must read the same run to run (tests/test_determinism.py).

`numpy_masked`: the step's shapes depend on NumPy draws (as transformers' wav2vec2/HuBERT time masking does);
`distributions`: a step through torch.distributions (Python code whose release drift the notes name);
`generated`: the model calls code an installed library generated into a temporary file of its own (as
torch_geometric's message-passing templates are).
"""

import os
import sys
import tempfile
import types

import numpy as np
import torch
from torch import nn


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        keep = int(np.random.randint(2, x.shape[1]))  # a NumPy draw decides a shape
        return self.proj(x[:, :keep])


def numpy_masked():
    return _Masked(), torch.randn(2, 10, 8)


class _Dist(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(4, 4)

    def forward(self, x):
        mean = self.loc(x)
        dist = torch.distributions.Independent(torch.distributions.Normal(mean, torch.ones_like(mean)), 1)
        return -dist.log_prob(x).mean() + dist.entropy().mean()


def distributions():
    return _Dist(), torch.randn(3, 4)


_TEMPLATE = "import torch\n\ndef collect(x):\n    return torch.relu(x) * 2\n"


def _generated_module():
    """A module named inside an installed package (transformers), its code in a fresh temporary file."""
    name = "transformers._opscan_generated_collect"
    module = sys.modules.get(name)
    if module is None:
        fd, path = tempfile.mkstemp(prefix="transformers_generated_", suffix=".py")
        with os.fdopen(fd, "w") as fh:
            fh.write(_TEMPLATE)
        module = types.ModuleType(name)
        module.__file__ = path
        exec(compile(_TEMPLATE, path, "exec"), module.__dict__)
        sys.modules[name] = module
    return module


class _UsesGenerated(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.collect = _generated_module().collect

    def forward(self, x):
        return self.collect(self.lin(x))  # the user's line


def generated():
    return _UsesGenerated(), torch.randn(2, 4)


class _NewApis(nn.Module):
    """Calls Python APIs torch 2.0.0 lacks (F.rms_norm: 2.4; torch.unravel_index: 2.2)."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.nn.functional.rms_norm(self.loc(x), (4,))
        rows, cols = torch.unravel_index(torch.arange(4), (2, 2))
        return h.sum() + (rows + cols).sum()


def new_apis():
    return _NewApis(), torch.randn(3, 4)


class _Routed(nn.Module):
    """A router whose random weights decide how many tokens an expert takes (an MoE's top-1 routing): the step's
    shapes follow the weights the build drew."""

    def __init__(self):
        super().__init__()
        self.router, self.expert = nn.Linear(8, 2), nn.Linear(8, 8)

    def forward(self, x):
        chosen = self.router(x).argmax(-1) == 0
        return self.expert(x[chosen]).sum() + x.sum()


def routed():
    torch.rand(1)  # a factory that draws before it builds: it must draw the same number run to run
    return _Routed(), torch.randn(64, 8)
