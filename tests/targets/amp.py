"""Test targets for mixed precision as a Mac runs it (tests/test_amp.py).

Every factory returns a model whose `amp` attribute says how `train_step` writes its autocast region:
"portable" (`torch.autocast(device_type=x.device.type, ...)`, "mps" on a Mac), "mps", "cuda" or "cpu" (each a
literal string), with dtype `amp_dtype`; `scaler` adds a torch.amp.GradScaler (device "mps").

- `mlp`: Linear, LayerNorm, GELU, Linear and a cross-entropy loss;
- `bert`: a tiny Hugging Face BERT classifier (random weights, sdpa attention, padded second sequence);
- `deconv3d`: Conv3d then ConvTranspose3d (MPS autocast keeps conv_transpose3d in float32 from 2.9);
- `spectral`: Linear then torch.fft.rfft of its output (no AutocastMPS rule for FFTs: a bfloat16 activation
  reaches the FFT, which MPS refuses).
"""

import torch
import torch.nn.functional as F
from torch import nn

from opscan.trace.step import call_model, default_loss


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.body(x)


class _Deconv3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)
        self.deconv = nn.ConvTranspose3d(4, 2, 3, padding=1)

    def forward(self, x):
        return self.deconv(self.conv(x))


class _Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return torch.fft.rfft(self.proj(x)).abs()


def _configured(model, amp="portable", dtype="float16", scaler=False):
    model.amp, model.amp_dtype, model.scaler = amp, getattr(torch, dtype), scaler
    return model


def _features(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def mlp(amp="portable", dtype="float16", scaler=False, batch=4):
    """The MLP and a batch of `batch` feature rows with class labels."""
    labels = torch.arange(int(batch)) % 5
    return _configured(_Mlp(), amp, dtype, scaler), (_features(int(batch), 16), labels)


def bert(amp="portable", dtype="float16", scaler=False):
    """A 2-layer BERT classifier and its dict of inputs (labels included: the model computes its loss)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 4:] = 0
    inputs = {"input_ids": torch.randint(0, 500, (2, 8), generator=gen), "attention_mask": mask,
              "labels": torch.tensor([0, 1])}
    return _configured(BertForSequenceClassification(config), amp, dtype, scaler), inputs


def deconv3d(amp="portable", dtype="float16", scaler=False):
    """Conv3d + ConvTranspose3d and one 2-channel 4x4x4 volume."""
    return _configured(_Deconv3d(), amp, dtype, scaler), _features(1, 2, 4, 4, 4)


def spectral(amp="portable", dtype="bfloat16", scaler=False):
    """Linear + rfft and 4 rows of 16 features."""
    return _configured(_Spectral(), amp, dtype, scaler), _features(4, 16)


def _loss(model, outputs, inputs):
    if isinstance(inputs, tuple):
        return F.cross_entropy(outputs, inputs[1])
    return default_loss(outputs, inputs)


def _forward(model, inputs):
    return call_model(model, inputs[:1] if isinstance(inputs, tuple) else inputs)


def _first(inputs):
    if isinstance(inputs, tuple):
        return inputs[0]
    return next(iter(inputs.values())) if isinstance(inputs, dict) else inputs


def _region(model, x):
    """The autocast region as the model's `amp` writes it (each spelling as a user would type it)."""
    if model.amp == "mps":
        return torch.autocast("mps", dtype=model.amp_dtype)
    if model.amp == "cuda":
        return torch.autocast("cuda", dtype=model.amp_dtype)
    if model.amp == "cpu":
        return torch.autocast("cpu", dtype=model.amp_dtype)
    return torch.autocast(device_type=x.device.type, dtype=model.amp_dtype)


def train_step(model, optimizer, inputs):
    """Forward and loss under the model's autocast region; backward (through a GradScaler when asked); step."""
    first = _first(inputs)
    scaler = torch.amp.GradScaler("mps") if model.scaler else None
    optimizer.zero_grad()
    with _region(model, first):
        loss = _loss(model, _forward(model, inputs), inputs)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss
