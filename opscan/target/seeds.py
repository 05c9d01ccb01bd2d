"""Target stage: the generators a build or a step may draw from, seeded, so a scan reads the same run to run.

Models built from configs draw their random weights, and a step's shapes can follow them (an MoE router's
top-k, a detector's proposals above a score), so the build is seeded as the step is (trace/__init__.py):
torch's generator, Python's `random` and NumPy's when it is imported (transformers' wav2vec2/HuBERT masking draws
its span count from NumPy). A factory that seeds itself is unaffected: its own seed comes after this one."""

from __future__ import annotations

import random
import sys


def seed_generators(seed: int = 0) -> None:
    """Seed torch's, Python's and (when imported) NumPy's global generators with `seed`."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
