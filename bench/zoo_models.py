"""Factories for the zoo (bench/zoo.yaml) that a plain `module:function` target can't express: Hugging Face
models from tiny configs with their inputs and labels, models whose loss needs targets, and the plain-torch
models the zoo adds. Random weights, nothing downloaded (HF_HUB_OFFLINE=1 is enough).

Each factory returns `(model, example_inputs)`; a model whose loss needs more than its outputs' sum computes
the loss in its own forward (`_WithLoss`), so this file needs no `train_step` hook.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Hugging Face models and torchvision detectors: opscan's zoo factories (opscan/zoo/factories.py), shared with
# `opscan zoo`'s families so the two zoos build them the same way
from opscan.zoo.factories import _Detection, _hf_inputs, detection, hf  # noqa: E402,F401


def vision_transformer():
    """torchvision's VisionTransformer (the class behind vit_b_16), tiny: 32x32 images, 8x8 patches."""
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=10)
    return model, torch.randn(2, 3, 32, 32, generator=_gen())


def swin():
    """torchvision's SwinTransformer (the class behind swin_t), tiny: two stages, 4x4 windows, 32x32 images."""
    from torchvision.models.swin_transformer import SwinTransformer

    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                            num_classes=10)
    return model, torch.randn(2, 3, 32, 32, generator=_gen())


# ---------------------------------------------------------------- plain torch


def transformer_encoder(layers: int = 2, width: int = 64, heads: int = 4):
    """nn.TransformerEncoder of nn.TransformerEncoderLayer (batch_first) on a (2, 16, width) batch."""
    layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, batch_first=True)
    return nn.TransformerEncoder(layer, layers), torch.randn(2, 16, width, generator=_gen())


class _Seq2Seq(nn.Module):
    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.transformer = nn.Transformer(width, 2, 1, 1, 64, batch_first=True)
        self.out = nn.Linear(width, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.out(h).flatten(0, 1), tgt.flatten())


def seq2seq_transformer():
    """nn.Transformer (1+1 layers) with a causal target mask and a cross-entropy loss."""
    g = _gen()
    return _Seq2Seq(), (torch.randint(0, 64, (2, 12), generator=g), torch.randint(0, 64, (2, 10), generator=g))


class _LSTMTagger(nn.Module):
    def __init__(self, proj_size: int = 0, bidirectional: bool = False, layers: int = 2):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=layers, batch_first=True, proj_size=proj_size,
                            bidirectional=bidirectional)
        out = (proj_size or 32) * (2 if bidirectional else 1)
        self.head = nn.Linear(out, 5)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def lstm(proj_size: int = 0, bidirectional: bool = False):
    """A 2-layer nn.LSTM (optionally with proj_size / bidirectional) and a linear head on (2, 12, 16)."""
    return _LSTMTagger(proj_size, bidirectional), torch.randn(2, 12, 16, generator=_gen())


class _GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.gru(x)[0])


def gru():
    """A 2-layer bidirectional nn.GRU on (2, 12, 16)."""
    return _GRU(), torch.randn(2, 12, 16, generator=_gen())


class _CTC(nn.Module):
    def __init__(self, classes=6):
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.lstm = nn.LSTM(16, 16)
        self.out = nn.Linear(16, classes)

    def forward(self, x, targets):
        h = self.conv(x).permute(2, 0, 1)  # (T, N, C)
        logp = self.out(self.lstm(h)[0]).log_softmax(-1)
        t, n = logp.shape[:2]
        return F.ctc_loss(logp, targets, torch.full((n,), t), torch.full((n,), targets.shape[1]))


def ctc():
    """Conv1d + LSTM + CTC loss over 20 frames, 4-label targets (the F.ctc_loss path of speech models)."""
    g = _gen()
    return _CTC(), (torch.randn(2, 8, 20, generator=g), torch.randint(1, 6, (2, 4), generator=g))


class _UNet3D(nn.Module):
    """Two-level 3D U-Net: Conv3d+BatchNorm3d+ReLU blocks, MaxPool3d, ConvTranspose3d, skip concatenation."""

    def __init__(self, c=8):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU(inplace=True))

        self.down1, self.down2 = block(1, c), block(c, 2 * c)
        self.pool = nn.MaxPool3d(2)
        self.bottom = block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose3d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = block(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
        self.dec1 = block(2 * c, c)
        self.out = nn.Conv3d(c, 2, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        b = self.bottom(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.out(u1)


def unet3d():
    """The 3D U-Net on a (1, 1, 16, 16, 16) volume."""
    return _UNet3D(), torch.randn(1, 1, 16, 16, 16, generator=_gen())


class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.LeakyReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.LeakyReLU())
        self.mu, self.logvar = nn.Linear(16 * 7 * 7, 8), nn.Linear(16 * 7 * 7, 8)
        self.dec = nn.Sequential(nn.Linear(8, 16 * 7 * 7), nn.Unflatten(1, (16, 7, 7)),
                                 nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.LeakyReLU(),
                                 nn.ConvTranspose2d(8, 1, 4, 2, 1))

    def forward(self, x):
        h = self.enc(x).flatten(1)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        recon = F.binary_cross_entropy_with_logits(self.dec(z), x, reduction="sum")
        return recon - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def vae():
    """A convolutional VAE on 28x28 images: reparameterisation (randn_like), BCE-with-logits + KL loss."""
    return _VAE(), torch.rand(4, 1, 28, 28, generator=_gen())


class _Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 16, mode="mean")
        self.item = nn.Embedding(50, 16)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, history, offsets, item):
        x = torch.cat([self.bag(history, offsets), self.item(item)], 1)
        return F.binary_cross_entropy_with_logits(self.mlp(x).squeeze(1), torch.ones(item.shape[0], device=x.device))


def recommender():
    """EmbeddingBag(mode=mean) over ragged histories + Embedding + MLP with BatchNorm1d and Dropout."""
    g = _gen()
    return _Recommender(), (torch.randint(0, 100, (10,), generator=g), torch.tensor([0, 3, 5, 8]),
                            torch.randint(0, 50, (4,), generator=g))


class _GraphConv(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(width, width), nn.Linear(width, 4)

    def _propagate(self, x, edges):
        messages = x[edges[0]]
        return torch.zeros_like(x).index_add(0, edges[1], messages) + x

    def forward(self, x, edges):
        h = self.lin1(self._propagate(x, edges)).relu()
        return self.lin2(self._propagate(h, edges)).log_softmax(-1).mean()


def graph_conv():
    """Message passing by gather + index_add over an edge list (the pattern of GNN libraries)."""
    g = _gen()
    return _GraphConv(), (torch.randn(10, 16, generator=g), torch.randint(0, 10, (2, 30), generator=g))


class _TCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(16 if i else 1, 16, 3, padding=2 ** i, dilation=2 ** i) for i in range(4))
        self.norm = nn.GroupNorm(4, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        for conv in self.convs:
            x = F.gelu(self.norm(conv(x)))
        return self.head(F.adaptive_avg_pool1d(x, 1).squeeze(-1))


def tcn():
    """Dilated Conv1d stack with GroupNorm and GELU on raw audio (2, 1, 256)."""
    return _TCN(), torch.randn(2, 1, 256, generator=_gen())


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(x + self.attn(x, x, x, need_weights=False)[0])


def mha():
    """nn.MultiheadAttention(64, 4) with need_weights=False (its sdpa path) and a residual LayerNorm."""
    return _MHA(), torch.randn(2, 16, 64, generator=_gen())
