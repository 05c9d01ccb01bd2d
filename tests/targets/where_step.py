"""A target for tests/test_where.py: a timm model trained by a `train_step` of the user's own, so the lines of that
step (the forward call, the loss, backward, the optimizer) are the user's, each with timm's line as `via` when timm
called torch."""

import torch
import torch.nn.functional as F


def build_model():
    """convnext_atto with random weights (no download) and one batch of two 3x64x64 images."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("convnext_atto", pretrained=False, num_classes=4), torch.randn(2, 3, 64, 64)


def train_step(model, optimizer, inputs):
    """Forward, a label-smoothed loss, backward, step: the lines test_where.py pins."""
    logits = model(inputs)
    loss = F.cross_entropy(logits, torch.tensor([1, 3], device=logits.device), label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
