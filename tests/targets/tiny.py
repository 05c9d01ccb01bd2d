"""Test target: a two-layer MLP on 4 features, with factories for the CLI's error paths.

`build_model` is the healthy target (inputs from `example_inputs()`); the other factories each break
one rule of the TARGET contract on purpose.
"""

import torch
from torch import nn


def build_model():
    """A Linear(4, 8) -> ReLU -> Linear(8, 2) model; its inputs come from example_inputs()."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def example_inputs():
    """A batch of 3 rows of 4 features."""
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def with_float64():
    """The MLP in float64 with float64 inputs: float64 is never supported on MPS."""
    return build_model().double(), torch.randn(3, 4, dtype=torch.float64)


def raises():
    """A factory that fails the way a misconfigured model does."""
    return _make_layer(width=-1)


def _make_layer(width):
    raise ValueError(f"width must be positive, got {width}")


def not_a_module():
    """Returns a config dict instead of a model."""
    return {"layers": 2}


def no_inputs_module():
    """Only used through --input: the factory gives the model, the command line gives the inputs."""
    return build_model()


not_callable = 42
