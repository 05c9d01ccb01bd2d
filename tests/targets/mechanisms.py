"""Test targets for issue 25's five mechanism classes (tests/test_mechanisms.py), one real model of each kind.

- `spectral`: an FNO-style spectral block (rfft2 -> complex64 weights -> irfft2), the spectral layer
  of Fourier neural operators;
- `bag_counts`: a bag-of-words classifier counting token ids with an unweighted torch.bincount;
  `bag_counts_weighted` counts with float32 weights, `bag_counts_int_weights` with int64 weights (float64
  output on the CPU: the form common_mps.py's bincount comment is about);
- `embedding_bag`: a fastText-style classifier on nn.EmbeddingBag (its backward is a composite in old releases);
- `diffusion`: a denoiser trained DDPM-style, whose forward holds a scheduler-like helper object that
  caches tensors on itself, and caches its last timestep embedding on the module;
- `gnn`: a graph-convolution layer aggregating neighbours with torch.sparse.mm on a COO adjacency;
"""

import torch
import torch.nn.functional as F
from torch import nn

_SEED = 0


def _gen():
    return torch.Generator().manual_seed(_SEED)


class SpectralConv2d(nn.Module):
    """The spectral convolution of a Fourier neural operator (Li et al. 2020): keep `modes` low
    frequencies of rfft2, mix channels there with complex64 weights, go back with irfft2."""

    def __init__(self, channels: int = 4, modes: int = 3):
        super().__init__()
        self.modes = modes
        scale = 1.0 / (channels * channels)
        self.weight = nn.Parameter(scale * torch.randn(channels, channels, modes, modes, dtype=torch.cfloat))

    def forward(self, x):
        spectrum = torch.fft.rfft2(x)
        m = self.modes
        low = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :m, :m], self.weight)
        out = torch.zeros_like(spectrum)
        out[:, :, :m, :m] = low
        return torch.fft.irfft2(out, s=x.shape[-2:])


class FNOBlock(nn.Module):
    """A lifted input, one Fourier layer (spectral conv + pointwise conv, GELU), projected back."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.lift = nn.Conv2d(1, channels, 1)
        self.spectral = SpectralConv2d(channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.project = nn.Conv2d(channels, 1, 1)

    def forward(self, x):
        h = self.lift(x)
        h = F.gelu(self.spectral(h) + self.pointwise(h))
        return self.project(h)


def spectral():
    """The FNO block and a batch of two 8x8 fields."""
    return FNOBlock(), torch.randn(2, 1, 8, 8, generator=_gen())


class BagCounts(nn.Module):
    """Counts token ids per vocabulary entry (bincount), then classifies the count vector."""

    def __init__(self, vocab: int = 16, weighted: bool = False, weight_dtype=torch.float32):
        super().__init__()
        self.vocab = vocab
        self.weighted = weighted
        self.register_buffer("token_weight", (torch.rand(vocab, generator=_gen()) * 4).to(weight_dtype))
        self.head = nn.Linear(vocab, 3)

    def forward(self, tokens):
        weights = self.token_weight[tokens] if self.weighted else None
        counts = torch.bincount(tokens, weights=weights, minlength=self.vocab)
        return self.head(counts.float().unsqueeze(0))


def bag_counts():
    """The unweighted bag-of-counts classifier and 12 token ids."""
    return BagCounts(), torch.randint(0, 16, (12,), generator=_gen())


def bag_counts_weighted():
    """The same classifier counting with float32 weights per token (bincount's weighted form)."""
    return BagCounts(weighted=True), torch.randint(0, 16, (12,), generator=_gen())


def bag_counts_int_weights():
    """The same classifier counting with integer weights per token (term frequencies as int64): the CPU
    returns float64 counts, the form common_mps.py's bincount comment is about."""
    return BagCounts(weighted=True, weight_dtype=torch.int64), torch.randint(0, 16, (12,), generator=_gen())


class TinyScheduler:
    """A plain object in the way of diffusers' DDPMScheduler.add_noise: it moves its schedule to the
    samples' device and stores it back on itself, keeps the last noise it drew, and a history list;
    `len()` of its tensors' shapes decides how far to unsqueeze."""

    def __init__(self, steps: int = 10):
        self.steps = steps
        betas = torch.linspace(1e-4, 0.02, steps)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self.last_noise = None
        self.history = []

    def add_noise(self, x, noise, t):
        self.alphas_cumprod = self.alphas_cumprod.to(device=x.device)
        self.last_noise = noise
        self.history.append(len(self.history))
        a = self.alphas_cumprod[t].flatten()
        while len(a.shape) < len(x.shape):
            a = a.unsqueeze(-1)
        return a.sqrt() * x + (1 - a).sqrt() * noise


class Denoiser(nn.Module):
    """An MLP denoiser trained DDPM-style: noise the input with the scheduler, predict the noise;
    it caches its last timestep embedding on itself."""

    def __init__(self, dim: int = 8, steps: int = 10):
        super().__init__()
        self.scheduler = TinyScheduler(steps)
        self.time_embed = nn.Embedding(steps, dim)
        self.net = nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim))
        self.last_temb = None
        self.calls = 0

    def forward(self, x):
        t = torch.randint(0, self.scheduler.steps, (x.shape[0],))
        noise = torch.randn_like(x)
        noisy = self.scheduler.add_noise(x, noise, t)
        self.last_temb = self.time_embed(t)
        self.calls += len(self.scheduler.history)
        return F.mse_loss(self.net(noisy + self.last_temb), noise)


def diffusion():
    """The denoiser with its scheduler and a batch of 4 samples."""
    return Denoiser(), torch.randn(4, 8, generator=_gen())


class GraphConv(nn.Module):
    """Kipf & Welling's graph convolution: A_hat @ X @ W with a sparse COO adjacency."""

    def __init__(self, nodes: int = 6, dim: int = 4, out: int = 3):
        super().__init__()
        src = torch.arange(nodes)
        dst = (src + 1) % nodes
        index = torch.stack([torch.cat([src, dst, src]), torch.cat([dst, src, src])])
        values = torch.full((index.shape[1],), 1.0 / 3)
        self.register_buffer("adjacency", torch.sparse_coo_tensor(index, values, (nodes, nodes), check_invariants=True).coalesce())
        self.linear = nn.Linear(dim, out)

    def forward(self, x):
        return torch.sparse.mm(self.adjacency, self.linear(x))


def gnn():
    """The graph convolution and features of 6 nodes."""
    return GraphConv(), torch.randn(6, 4, generator=_gen())


class DiffusersDenoiser(nn.Module):
    """The same denoiser with diffusers' own DDPMScheduler (add_noise in forward, as its training
    examples do); needs `pip install diffusers`."""

    def __init__(self, dim: int = 8, steps: int = 10):
        super().__init__()
        from diffusers import DDPMScheduler

        self.scheduler = DDPMScheduler(num_train_timesteps=steps)
        self.time_embed = nn.Embedding(steps, dim)
        self.net = nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim))

    def forward(self, x):
        t = torch.randint(0, self.scheduler.config.num_train_timesteps, (x.shape[0],))
        noise = torch.randn_like(x)
        noisy = self.scheduler.add_noise(x, noise, t)
        return F.mse_loss(self.net(noisy + self.time_embed(t)), noise)


def diffusers_ddpm():
    """The denoiser with diffusers' DDPMScheduler and a batch of 4 samples."""
    return DiffusersDenoiser(), torch.randn(4, 8, generator=_gen())


class BagOfEmbeddings(nn.Module):
    """fastText-style text classifier: nn.EmbeddingBag (mean of token embeddings per bag), then a linear head;
    `weighted`: bags summed with per-sample weights (mode="sum")."""

    def __init__(self, vocab: int = 32, dim: int = 8, weighted: bool = False):
        super().__init__()
        self.weighted = weighted
        self.bag = nn.EmbeddingBag(vocab, dim, mode="sum" if weighted else "mean")
        self.head = nn.Linear(dim, 3)

    def forward(self, tokens):
        offsets = torch.tensor([0, 4, 9])
        weights = torch.linspace(0.5, 1.5, tokens.shape[0]) if self.weighted else None
        return self.head(self.bag(tokens, offsets, per_sample_weights=weights))


def embedding_bag():
    """The bag-of-embeddings classifier and 12 token ids in 3 bags."""
    return BagOfEmbeddings(), torch.randint(0, 32, (12,), generator=_gen())
