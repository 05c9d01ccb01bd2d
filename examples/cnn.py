"""Example target: a torchvision ResNet-18 image classifier, trained for one step.

Shows the two simplest hooks of a TARGET file:
- the factory `build_model()` returns `(model, example_inputs)`, so no `--input` is needed;
- `loss_fn(outputs, inputs)` replaces opscan's default loss (the sum of the floating outputs) with
  cross-entropy against fixed targets, so the trace holds the loss ops a real classifier runs. The targets are a
  module-level tensor, so the loss moves them to the logits' device first, as code that runs on a Mac must:
  `model.to("mps")` moves parameters and buffers, never a module-level tensor (examples/host_tensor.py shows
  the finding opscan gives when that move is missing).

Random weights (`weights=None`), batch 2 of 3x64x64 images: small enough to trace in seconds.

    opscan examples/cnn.py:build_model
"""

import torch
import torch.nn.functional as F
import torchvision

NUM_CLASSES = 10
BATCH = 2
TARGETS = torch.tensor([3, 7])  # one fixed class label per image


def build_model():
    """ResNet-18 with 10 classes and random weights, and a batch of two 64x64 RGB images."""
    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES)
    images = torch.randn(BATCH, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return model, images


def loss_fn(outputs, inputs):
    """Cross-entropy of the logits against the fixed class labels (repeated when opscan sizes the step at a
    larger batch, so the memory estimate can find the largest batch that fits)."""
    labels = TARGETS if len(outputs) == BATCH else TARGETS.repeat(-(-len(outputs) // BATCH))[: len(outputs)]
    return F.cross_entropy(outputs, labels.to(outputs.device))
