"""Targets for tests/test_where.py: library models as the zoo scans them, with opscan's default step. No line of this
file runs while the step does (opscan calls the model), so the factory's `def` line stands in for the user's, with
the library's own line that called torch as `via`."""

import torch


def timm_model(name: str = "convnext_atto"):
    """A timm model with random weights (no download) and one batch of two 3x64x64 images."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=4)
    return model, torch.randn(2, 3, 64, 64)
