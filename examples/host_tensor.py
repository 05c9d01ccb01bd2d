"""Example target on purpose WRONG on a Mac: a step whose tensors do not all follow the model to the device.

`opscan examples/host_tensor.py:build_model` shows the placement findings: three tensors the step keeps on the
CPU when `model.to("mps")` moves the rest, each at the line that made it, where it meets an MPS kernel that
refuses it, and the fix. On a Mac this step raises at the first of them. The lane is decided without them (they
are bugs of this file, not limits of MPS): mac-first once they are fixed.

- `CLASS_WEIGHTS`: a module-level tensor (fix: `.to(logits.device)` where the loss uses it);
- `self.causal`: a mask kept as a plain attribute, not a registered buffer, so `Module.to()` leaves it behind
  (fix: `self.register_buffer("causal", ...)`);
- `torch.arange(seq)`: position ids made without `device=` (fix: `torch.arange(seq, device=tokens.device)`).

examples/cnn.py is the same kind of step done right.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, DIM, CLASSES = 32, 6, 16, 3
CLASS_WEIGHTS = torch.tensor([1.0, 2.0, 0.5])  # stays on the CPU: model.to() never sees it


class TinyTagger(nn.Module):
    """Token and position embeddings, causal masked mixing, a linear head."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Embedding(SEQ, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, CLASSES)
        self.causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)  # a plain attribute, not a buffer

    def forward(self, tokens):
        seq = tokens.size(1)
        ids = torch.arange(seq)  # made on the CPU: no device=
        h = self.tokens(tokens) + self.positions(ids)
        scores = (h @ h.transpose(1, 2)).masked_fill(self.causal[:seq, :seq], float("-inf"))
        h = self.mix(torch.softmax(scores, -1) @ h)
        return self.head(h.mean(1))


def build_model():
    """The tagger and a batch of two token sequences."""
    return TinyTagger(), torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def loss_fn(outputs, inputs):
    """Weighted cross-entropy against fixed labels."""
    labels = torch.arange(outputs.size(0), device=outputs.device) % CLASSES
    return F.cross_entropy(outputs, labels, weight=CLASS_WEIGHTS)
