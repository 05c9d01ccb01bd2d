"""Test target: the crafted stack of tests/targets/repeat.py trained by a foreach AdamW, whose calls take every
parameter at once: the optimizer's work can't be replicated per layer, so every layer is traced."""

import torch

from repeat import build_model  # noqa: F401  (the factory; tests/targets is on the target's import path)


def build_optimizer(model):
    """AdamW over all parameters in one foreach call per update."""
    return torch.optim.AdamW(model.parameters(), foreach=True)
