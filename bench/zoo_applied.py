"""Factories for the zoo's applied-domain models written with torch (and torchvision) alone: recommender and
tabular, time series, reinforcement learning, detection heads (torchvision.ops), sparse layers and models that
keep state on themselves (issue 25). Tiny configs, random weights; each factory returns `(model, inputs)` and
the model's forward returns the loss (bench/zoo_domains.py has the others).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Independent, Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform
from torchvision.ops import (DeformConv2d, FeaturePyramidNetwork, batched_nms, box_convert, generalized_box_iou_loss,
                             roi_align, sigmoid_focal_loss)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- recommender and tabular


class _DLRM(nn.Module):
    """DLRM: EmbeddingBag(sum) per sparse feature with offsets, bottom MLP, pairwise dot interactions (bmm and
    the upper triangle by triu_indices), top MLP, BCE."""

    def __init__(self, tables=3, rows=200, dim=8):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, indices, offsets, clicks):
        feats = torch.stack([self.bottom(dense)] + [bag(idx, offsets) for bag, idx in zip(self.bags, indices)], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], offset=1, device=feats.device)
        x = torch.cat([feats[:, 0], inter[:, i, j]], 1)
        return F.binary_cross_entropy_with_logits(self.top(x).squeeze(1), clicks)


def dlrm():
    """DLRM-like click model: 3 EmbeddingBag(sum) tables over ragged bags, dot interactions, 4 samples."""
    g = _gen()
    idx = torch.randint(0, 200, (3, 10), generator=g)
    return _DLRM(), (torch.randn(4, 4, generator=g), idx, torch.tensor([0, 2, 5, 7]), torch.rand(4, generator=g))


class _TabTransformer(nn.Module):
    """TabTransformer: one embedding per categorical column, a TransformerEncoder over the columns, LayerNorm on
    the continuous features, MLP head."""

    def __init__(self, cardinalities=(5, 7, 3, 11), continuous=3, dim=16, classes=3):
        super().__init__()
        self.embeds = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)
        layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.norm = nn.LayerNorm(continuous)
        self.head = nn.Sequential(nn.Linear(dim * len(cardinalities) + continuous, 32), nn.ReLU(),
                                  nn.Linear(32, classes))

    def forward(self, categorical, continuous, labels):
        cols = torch.stack([e(categorical[:, i]) for i, e in enumerate(self.embeds)], 1)
        x = torch.cat([self.encoder(cols).flatten(1), self.norm(continuous)], 1)
        return F.cross_entropy(self.head(x), labels)


def tab_transformer():
    """TabTransformer on 8 rows of 4 categorical and 3 continuous columns (training: the encoder's slow path)."""
    g = _gen()
    cat = torch.stack([torch.randint(0, c, (8,), generator=g) for c in (5, 7, 3, 11)], 1)
    return _TabTransformer(), (cat, torch.randn(8, 3, generator=g), torch.randint(0, 3, (8,), generator=g))


# ---------------------------------------------------------------- time series


class _AutoCorrelation(nn.Module):
    """Autoformer's auto-correlation: period correlations by rfft(q) * conj(rfft(k)) and irfft, top-k lags,
    values rolled by each lag and mixed by the softmaxed correlations."""

    def __init__(self, dim: int, top_k: int = 3):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.top_k = top_k

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        corr = torch.fft.irfft(torch.fft.rfft(q, dim=1) * torch.conj(torch.fft.rfft(k, dim=1)), n=x.shape[1], dim=1)
        weights, lags = torch.topk(corr.mean(-1), self.top_k, dim=-1)  # (B, top_k)
        weights = torch.softmax(weights, -1)
        agg = torch.zeros_like(v)
        for i in range(self.top_k):
            rolled = torch.stack([torch.roll(v[b], -int(lags[b, i]), 0) for b in range(v.shape[0])])
            agg = agg + rolled * weights[:, i].view(-1, 1, 1)
        return self.out(agg)


class _Autoformer(nn.Module):
    """An Autoformer-like encoder: series decomposition (moving average by avg_pool1d on replicate-padded
    series) around an auto-correlation block, forecasting the next steps."""

    def __init__(self, dim=8, horizon=8, kernel=5):
        super().__init__()
        self.kernel, self.horizon = kernel, horizon
        self.embed = nn.Linear(1, dim)
        self.attn = _AutoCorrelation(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, dim))
        self.head = nn.Linear(dim, horizon)

    def _decompose(self, x):  # (B, L, D) -> seasonal, trend
        pad = (self.kernel - 1) // 2
        padded = torch.cat([x[:, :1].expand(-1, pad, -1), x, x[:, -1:].expand(-1, pad, -1)], 1)
        trend = F.avg_pool1d(padded.transpose(1, 2), self.kernel, stride=1).transpose(1, 2)
        return x - trend, trend

    def forward(self, series, future):
        h = self.embed(series.unsqueeze(-1))
        seasonal, trend = self._decompose(h + self.attn(h))
        seasonal, trend2 = self._decompose(seasonal + self.ff(seasonal))
        pred = self.head((seasonal + trend + trend2)[:, -1])
        return F.mse_loss(pred, future)


def autoformer():
    """Autoformer-like forecaster on 2 series of 32 steps: FFT auto-correlation, topk lags, roll, decomposition."""
    g = _gen()
    return _Autoformer(), (torch.randn(2, 32, generator=g), torch.randn(2, 8, generator=g))


class _PatchTST(nn.Module):
    """PatchTST-like: RevIN (instance normalisation), patches by Tensor.unfold, a TransformerEncoder, flatten head."""

    def __init__(self, length=32, patch=8, stride=4, dim=16, horizon=8):
        super().__init__()
        self.patch, self.stride = patch, stride
        patches = (length - patch) // stride + 1
        self.embed = nn.Linear(patch, dim)
        self.pos = nn.Parameter(torch.zeros(patches, dim))
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 2, 32, batch_first=True), 1)
        self.head = nn.Linear(patches * dim, horizon)

    def forward(self, series, future):  # (B, C, L)
        mean, std = series.mean(-1, keepdim=True), series.std(-1, keepdim=True) + 1e-5
        x = ((series - mean) / std).unfold(-1, self.patch, self.stride)  # (B, C, P, patch)
        b, c = x.shape[:2]
        h = self.encoder(self.embed(x).flatten(0, 1) + self.pos)
        pred = self.head(h.flatten(1)).view(b, c, -1) * std + mean
        return F.mse_loss(pred, future)


def patchtst():
    """PatchTST-like forecaster: 2 samples x 3 channels x 32 steps, patches of 8 by Tensor.unfold, RevIN."""
    g = _gen()
    return _PatchTST(), (torch.randn(2, 3, 32, generator=g), torch.randn(2, 3, 8, generator=g))


class _NBeats(nn.Module):
    """N-BEATS: doubly residual MLP stacks with a polynomial trend basis and a Fourier seasonality basis."""

    def __init__(self, length=24, horizon=8, width=32):
        super().__init__()
        t_back, t_fore = torch.arange(length) / length, torch.arange(horizon) / horizon
        self.register_buffer("trend_b", torch.stack([t_back ** p for p in range(3)]))
        self.register_buffer("trend_f", torch.stack([t_fore ** p for p in range(3)]))
        harmonics = torch.arange(1, 4).float().unsqueeze(1) * 2 * torch.pi
        self.register_buffer("season_b", torch.cat([torch.cos(harmonics * t_back), torch.sin(harmonics * t_back)]))
        self.register_buffer("season_f", torch.cat([torch.cos(harmonics * t_fore), torch.sin(harmonics * t_fore)]))
        self.trend = nn.Sequential(nn.Linear(length, width), nn.ReLU(), nn.Linear(width, 3))
        self.season = nn.Sequential(nn.Linear(length, width), nn.ReLU(), nn.Linear(width, 6))

    def forward(self, series, future):
        theta = self.trend(series)
        residual, forecast = series - theta @ self.trend_b, theta @ self.trend_f
        theta = self.season(residual)
        forecast = forecast + theta @ self.season_f
        return F.l1_loss(forecast, future)


def nbeats():
    """N-BEATS (trend + seasonality blocks) on 4 series of 24 steps, horizon 8."""
    g = _gen()
    return _NBeats(), (torch.randn(4, 24, generator=g), torch.randn(4, 8, generator=g))


# ---------------------------------------------------------------- reinforcement learning


class _PPODiscrete(nn.Module):
    """PPO actor-critic with a Categorical policy: clipped surrogate, value loss, entropy bonus."""

    def __init__(self, obs=8, actions=4, clip=0.2):
        super().__init__()
        self.clip = clip
        self.body = nn.Sequential(nn.Linear(obs, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, actions), nn.Linear(32, 1)

    def forward(self, obs, actions, old_logp, advantages, returns):
        h = self.body(obs)
        dist = Categorical(logits=self.pi(h))
        ratio = torch.exp(dist.log_prob(actions) - old_logp)
        surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * advantages)
        value_loss = F.mse_loss(self.v(h).squeeze(-1), returns)
        return -surrogate.mean() + 0.5 * value_loss - 0.01 * dist.entropy().mean()


def ppo_discrete():
    """PPO with torch.distributions.Categorical (log_prob, entropy) on a batch of 16 transitions."""
    g = _gen()
    return _PPODiscrete(), (torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g),
                            -torch.rand(16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g))


class _PPOContinuous(nn.Module):
    """PPO with a diagonal Gaussian policy (state-independent log std), clipped surrogate and value loss."""

    def __init__(self, obs=6, act=2, clip=0.2):
        super().__init__()
        self.clip = clip
        self.mu = nn.Sequential(nn.Linear(obs, 32), nn.Tanh(), nn.Linear(32, act))
        self.log_std = nn.Parameter(torch.zeros(act))
        self.v = nn.Sequential(nn.Linear(obs, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs, actions, old_logp, advantages, returns):
        dist = Independent(Normal(self.mu(obs), self.log_std.exp()), 1)
        ratio = torch.exp(dist.log_prob(actions) - old_logp)
        surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * advantages)
        return -surrogate.mean() + 0.5 * F.mse_loss(self.v(obs).squeeze(-1), returns) - 0.01 * dist.entropy().mean()


def ppo_gaussian():
    """PPO with Independent(Normal) actions (log_prob, entropy) on a batch of 16 transitions."""
    g = _gen()
    return _PPOContinuous(), (torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g),
                              -torch.rand(16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g))


class _SACActor(nn.Module):
    """SAC's actor loss: a tanh-squashed Gaussian (TransformedDistribution with TanhTransform), rsample,
    log_prob with the tanh log-det, and a Q critic."""

    def __init__(self, obs=6, act=2, alpha=0.2):
        super().__init__()
        self.alpha = alpha
        self.body = nn.Sequential(nn.Linear(obs, 32), nn.ReLU(), nn.Linear(32, 2 * act))
        self.q = nn.Sequential(nn.Linear(obs + act, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, obs):
        mu, log_std = self.body(obs).chunk(2, -1)
        dist = TransformedDistribution(Normal(mu, log_std.clamp(-5, 2).exp()), [TanhTransform(cache_size=1)])
        action = dist.rsample()
        log_prob = dist.log_prob(action).sum(-1)
        return (self.alpha * log_prob - self.q(torch.cat([obs, action], -1)).squeeze(-1)).mean()


def sac_actor():
    """SAC actor step: tanh-squashed Normal (TanhTransform log-det by softplus) and a Q network."""
    return _SACActor(), torch.randn(16, 6, generator=_gen())


# ---------------------------------------------------------------- detection and segmentation heads


class _RoIHead(nn.Module):
    """A two-stage detector's box head: conv features, torchvision.ops.roi_align on given proposals, MLP,
    class cross-entropy and smooth-L1 box regression."""

    def __init__(self, classes=3):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU())
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(16 * 7 * 7, 64), nn.ReLU())
        self.cls, self.box = nn.Linear(64, classes), nn.Linear(64, 4 * classes)

    def forward(self, images, rois, labels, targets):
        feats = roi_align(self.backbone(images), rois, output_size=7, spatial_scale=0.25, sampling_ratio=2,
                          aligned=True)
        h = self.fc(feats)
        deltas = self.box(h).view(h.shape[0], -1, 4)[torch.arange(h.shape[0], device=h.device), labels]
        return F.cross_entropy(self.cls(h), labels) + F.smooth_l1_loss(deltas, targets)


def roi_head():
    """RoIAlign box head (torchvision.ops.roi_align, aligned) on 6 proposals over 2 64x64 images."""
    g = _gen()
    boxes = torch.tensor([[4., 4., 30., 30.], [10., 8., 50., 40.], [0., 0., 63., 63.]])
    rois = torch.cat([torch.tensor([[0.], [0.], [0.], [1.], [1.], [1.]]), torch.cat([boxes, boxes])], 1)
    return _RoIHead(), (torch.randn(2, 3, 64, 64, generator=g), rois, torch.randint(0, 3, (6,), generator=g),
                        torch.randn(6, 4, generator=g))


class _DeformHead(nn.Module):
    """Deformable convolution (DCNv1): offsets predicted by a conv, torchvision.ops.DeformConv2d, segmentation
    logits and a cross-entropy."""

    def __init__(self, classes=3):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.offset = nn.Conv2d(8, 2 * 3 * 3, 3, padding=1)
        self.deform = DeformConv2d(8, 8, 3, padding=1)
        self.out = nn.Conv2d(8, classes, 1)

    def forward(self, images, masks):
        h = F.relu(self.stem(images))
        return F.cross_entropy(self.out(F.relu(self.deform(h, self.offset(h)))), masks)


def deform_head():
    """DeformConv2d segmentation head (torchvision::deform_conv2d and its backward) on 2 16x16 images."""
    g = _gen()
    return _DeformHead(), (torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 3, (2, 16, 16), generator=g))


class _FPNFocal(nn.Module):
    """RetinaNet-like dense head: torchvision.ops.FeaturePyramidNetwork over two levels, sigmoid_focal_loss on
    the class map and generalized_box_iou_loss on boxes."""

    def __init__(self, classes=3):
        super().__init__()
        self.c3, self.c4 = nn.Conv2d(3, 16, 3, 4, 1), nn.Conv2d(16, 32, 3, 2, 1)
        self.fpn = FeaturePyramidNetwork([16, 32], 16)
        self.cls, self.reg = nn.Conv2d(16, classes, 3, padding=1), nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, images, cls_targets, boxes):
        c3 = F.relu(self.c3(images))
        p3 = self.fpn({"c3": c3, "c4": F.relu(self.c4(c3))})["c3"]
        loss = sigmoid_focal_loss(self.cls(p3), cls_targets, reduction="mean")
        raw = self.reg(p3).mean((2, 3))
        pred = torch.cat([raw[:, :2], raw[:, :2] + F.softplus(raw[:, 2:])], 1)
        return loss + generalized_box_iou_loss(pred, boxes, reduction="mean")


def fpn_focal():
    """FPN (torchvision.ops) with sigmoid focal loss and GIoU loss on 2 32x32 images."""
    g = _gen()
    boxes = torch.tensor([[0.1, 0.1, 0.5, 0.6], [0.2, 0.3, 0.9, 0.8]])
    return _FPNFocal(), (torch.randn(2, 3, 32, 32, generator=g), torch.rand(2, 3, 8, 8, generator=g).round(), boxes)


class _Detector(nn.Module):
    """Inference post-processing: a conv head decodes boxes and scores, torchvision.ops.batched_nms keeps the
    best per class (a few hundred boxes: the coordinate-offset path)."""

    def __init__(self, classes=3):
        super().__init__()
        self.classes = classes
        self.head = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 4 + classes, 1))

    def forward(self, images):
        out = self.head(images).flatten(2).transpose(1, 2)[0]  # (HW, 4 + classes)
        boxes = box_convert(out[:, :4].sigmoid() * 64, "cxcywh", "xyxy")
        scores, labels = out[:, 4:].softmax(-1).max(-1)
        keep = batched_nms(boxes, scores, labels, 0.5)[:20]
        return boxes[keep], scores[keep], labels[keep]


def nms_detector():
    """Dense detector + batched_nms at inference (torchvision::nms on 256 boxes)."""
    return _Detector(), torch.randn(1, 3, 32, 32, generator=_gen())


# ---------------------------------------------------------------- sparse layers and state


class _SparseGCN(nn.Module):
    """A GCN whose normalised adjacency is a sparse COO tensor: torch.sparse.mm(adj, X W) per layer."""

    def __init__(self, width=16, classes=4):
        super().__init__()
        self.w1, self.w2 = nn.Linear(width, width), nn.Linear(width, classes)

    def forward(self, x, edges, labels):
        n = x.shape[0]
        loops = torch.arange(n, device=x.device)
        index = torch.cat([edges, torch.stack([loops, loops])], 1)
        deg = torch.zeros(n, device=x.device).index_add_(0, index[0], torch.ones(index.shape[1], device=x.device))
        values = deg[index[0]].rsqrt() * deg[index[1]].rsqrt()
        adj = torch.sparse_coo_tensor(index, values, (n, n))
        h = F.relu(torch.sparse.mm(adj, self.w1(x)))
        return F.cross_entropy(torch.sparse.mm(adj, self.w2(h)), labels)


def sparse_gcn():
    """GCN with a sparse COO adjacency (torch.sparse_coo_tensor, torch.sparse.mm) on 12 nodes, 30 edges."""
    g = _gen()
    return _SparseGCN(), (torch.randn(12, 16, generator=g), torch.randint(0, 12, (2, 30), generator=g),
                          torch.randint(0, 4, (12,), generator=g))


class _MeanTeacher(nn.Module):
    """Self-distillation with state on the module: an EMA teacher updated in place in every forward
    (torch._foreach_lerp_ under no_grad), a step counter buffer, a cosine loss to the teacher."""

    def __init__(self, momentum=0.99):
        super().__init__()
        self.momentum = momentum
        self.student = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.teacher = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).requires_grad_(False)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        with torch.no_grad():
            torch._foreach_lerp_(list(self.teacher.parameters()), list(self.student.parameters()), 1 - self.momentum)
            self.steps += 1
            target = self.teacher(x + 0.1 * torch.randn_like(x))
        return (1 - F.cosine_similarity(self.student(x), target, dim=-1)).mean()


def mean_teacher():
    """Mean-teacher / BYOL-style EMA teacher kept on the module, updated in its forward."""
    return _MeanTeacher(), torch.randn(8, 16, generator=_gen())


class _MoCo(nn.Module):
    """MoCo: a queue of negative keys kept in a buffer and overwritten in every forward (index_copy_), an
    InfoNCE loss over [positive, queue]."""

    def __init__(self, dim=8, queue=32, temperature=0.1):
        super().__init__()
        self.t = temperature
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, dim))
        self.register_buffer("queue", F.normalize(torch.randn(queue, dim, generator=_gen()), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        q = F.normalize(self.encoder(x), dim=1)
        with torch.no_grad():
            k = F.normalize(self.encoder(x + 0.1 * torch.randn_like(x)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().t()], 1) / self.t
        loss = F.cross_entropy(logits, torch.zeros(x.shape[0], dtype=torch.long, device=x.device))
        with torch.no_grad():
            slots = (self.ptr + torch.arange(x.shape[0], device=x.device)) % self.queue.shape[0]
            self.queue.index_copy_(0, slots, k)
            self.ptr.copy_((self.ptr + x.shape[0]) % self.queue.shape[0])
        return loss


def moco():
    """MoCo-style contrastive step with a negative-key queue buffer updated in place (index_copy_)."""
    return _MoCo(), torch.randn(8, 16, generator=_gen())


class _CachedDecoder(nn.Module):
    """One decoding step of a causal transformer with its key/value cache kept on the module (self.cache_k,
    self.cache_v grow by torch.cat on every call): inference, as generation runs."""

    def __init__(self, vocab=64, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab)
        self.cache_k = self.cache_v = None

    def forward(self, tokens):
        b, t = tokens.shape
        q, k, v = self.qkv(self.embed(tokens)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.cache_k is not None:
            k, v = torch.cat([self.cache_k, k], 2), torch.cat([self.cache_v, v], 2)
        self.cache_k, self.cache_v = k, v
        h = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        return self.lm_head(self.norm(self.proj(h)))[:, -1].argmax(-1)


def cached_decoder():
    """A KV-cached decoder step (inference): a 6-token prompt cached beforehand, then one new token."""
    model = _CachedDecoder()
    g = _gen()
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 6), generator=g))  # fills the cache, as the prompt's pass does
    return model, torch.randint(0, 64, (2, 1), generator=g)


def device_tensors(model, inputs):
    """The tensors this file's steps find on the device though no step moved them (opscan's target hook,
    docs/targets.md): the KV cache cached_decoder's factory fills before the step, which a Mac script fills after
    `model.to("mps")`, on MPS."""
    return [t for t in (getattr(model, "cache_k", None), getattr(model, "cache_v", None)) if t is not None]
