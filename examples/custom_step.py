"""Example target: every step hook a TARGET file can define, on a small model that needs only torch.

opscan looks for these names next to the factory (each one optional):

- `build_model()` — the factory named in TARGET. Returns the model, or `(model, example_inputs)`.
- `example_inputs()` — used when the factory returns only the model (it may take the model as its
  one argument). `--input SHAPE:DTYPE` on the command line overrides both.
- `build_optimizer(model)` — the optimizer whose `step()` is traced (default: AdamW). Here SGD with
  momentum, so the optimizer phase shows the momentum-buffer ops.
- `train_step(model, optimizer, inputs)` — replaces opscan's default step (forward, loss, backward,
  `optimizer.step()`, `optimizer.zero_grad()`) when a real step does more. Here the forward and the
  loss run under `torch.autocast(device_type=features.device.type, dtype=torch.bfloat16)` — the portable
  spelling: autocast on whatever device the model runs on, "mps" on a Mac, so opscan traces the region under
  the predicted-for release's MPS autocast policy (bfloat16 linears; float32 layer_norm and loss) — and
  gradients are clipped before the step (`clip_grad_norm_`'s ops are traced as part of the optimizer phase).
- `loss_fn(outputs, inputs)` — used by the default step only; with `train_step` defined it is not
  called, so this file does not define it.

    opscan examples/custom_step.py:build_model
"""

import torch
from torch import nn

BATCH, FEATURES, CLASSES = 4, 32, 5


class SmallNet(nn.Module):
    """Two linear blocks with LayerNorm and GELU, then a classifier head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(FEATURES, 64), nn.LayerNorm(64), nn.GELU(),
            nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU(),
        )
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def build_model():
    """The model only: its inputs come from example_inputs()."""
    return SmallNet()


def example_inputs():
    """Features and class labels, passed to train_step as one tuple."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, FEATURES, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)


def build_optimizer(model):
    """SGD with momentum (opscan's default would be AdamW)."""
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(model, optimizer, inputs):
    """Mixed-precision forward and loss, backward, gradient clipping, optimizer step."""
    features, labels = inputs
    optimizer.zero_grad()
    with torch.autocast(device_type=features.device.type, dtype=torch.bfloat16):
        logits = model(features)
        loss = nn.functional.cross_entropy(logits, labels)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    return loss
