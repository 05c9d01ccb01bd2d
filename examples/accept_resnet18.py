"""Example target for `opscan accept`: torchvision ResNet-18 trained with cross-entropy, on any device.

Like examples/cnn.py, but the labels follow the logits to their device (`loss_fn` moves them), so the
same file runs on mps, cuda and cpu. Random weights, 10 classes, batch 4 of 3x64x64 images.

    opscan accept examples/accept_resnet18.py:build_model --device cuda --reference cpu
"""

import torch
import torch.nn.functional as F
import torchvision

NUM_CLASSES = 10
BATCH = 4
LABELS = torch.tensor([3, 7, 1, 0])  # one fixed class per image


def build_model(batch: int = BATCH, size: int = 64):
    """ResNet-18 (random weights, 10 classes) and a batch of images."""
    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES)
    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    return model, images


def loss_fn(outputs, inputs):
    """Cross-entropy against fixed labels, moved to the logits' device."""
    labels = LABELS.repeat(outputs.shape[0] // len(LABELS) + 1)[: outputs.shape[0]]
    return F.cross_entropy(outputs, labels.to(outputs.device))
