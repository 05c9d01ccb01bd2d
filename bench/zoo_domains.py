"""Factories for the zoo's domain models written with torch (and torchvision) alone: scientific ML, signal and
audio, point clouds, probabilistic and generative models, recommender and tabular, time series, reinforcement
learning, sparse layers and models that keep state on themselves (issue 25). Tiny configs, random weights.

Each factory returns `(model, example_inputs)`; the loss is computed in the model's own forward (a scalar), so
the default step (forward, backward, AdamW) is a real training step. The library-based ones are in
bench/zoo_libs.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Bernoulli, Independent, Normal, kl_divergence


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- scientific ML


class _Spectral1d(nn.Module):
    """FNO's spectral convolution: rfft, a complex64 weight on the lowest modes (einsum), irfft."""

    def __init__(self, width: int, modes: int):
        super().__init__()
        self.modes = modes
        self.weight = nn.Parameter(torch.randn(width, width, modes, dtype=torch.cfloat, generator=_gen()) / width)

    def forward(self, x):
        x_ft = torch.fft.rfft(x)
        out = torch.zeros(x.shape[0], x.shape[1], x_ft.shape[-1], dtype=torch.cfloat, device=x.device)
        out[:, :, :self.modes] = torch.einsum("bix,iox->box", x_ft[:, :, :self.modes], self.weight)
        return torch.fft.irfft(out, n=x.shape[-1])


class _FNO1d(nn.Module):
    def __init__(self, width=16, modes=8, layers=2):
        super().__init__()
        self.lift, self.proj = nn.Conv1d(2, width, 1), nn.Conv1d(width, 1, 1)
        self.spectral = nn.ModuleList(_Spectral1d(width, modes) for _ in range(layers))
        self.local = nn.ModuleList(nn.Conv1d(width, width, 1) for _ in range(layers))

    def forward(self, a, u):
        grid = torch.linspace(0, 1, a.shape[-1], device=a.device).expand(a.shape[0], 1, -1)
        h = self.lift(torch.cat([a, grid], 1))
        for spectral, local in zip(self.spectral, self.local):
            h = F.gelu(spectral(h) + local(h))
        return F.mse_loss(self.proj(h), u)


def fno1d():
    """Fourier neural operator (1-D, Burgers-like): torch.fft.rfft/irfft and a complex64 einsum per layer."""
    g = _gen()
    return _FNO1d(), (torch.randn(2, 1, 64, generator=g), torch.randn(2, 1, 64, generator=g))


class _FNO2d(nn.Module):
    def __init__(self, width=8, modes=4):
        super().__init__()
        self.modes = modes
        self.lift, self.proj = nn.Conv2d(1, width, 1), nn.Conv2d(width, 1, 1)
        scale = 1 / width
        self.w1 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat, generator=_gen(1)))
        self.w2 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat, generator=_gen(2)))
        self.local = nn.Conv2d(width, width, 1)

    def forward(self, a, u):
        h = self.lift(a)
        m, (rows, cols) = self.modes, h.shape[-2:]
        h_ft = torch.fft.rfft2(h)
        out = torch.zeros(h.shape[0], h.shape[1], rows, cols // 2 + 1, dtype=torch.cfloat, device=h.device)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", h_ft[:, :, :m, :m], self.w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", h_ft[:, :, -m:, :m], self.w2)
        h = F.gelu(torch.fft.irfft2(out, s=(rows, cols)) + self.local(h))
        return F.mse_loss(self.proj(h), u)


def fno2d():
    """Fourier neural operator (2-D, Darcy-like): rfft2/irfft2, two complex64 mode blocks, 16x16 fields."""
    g = _gen()
    return _FNO2d(), (torch.randn(2, 1, 16, 16, generator=g), torch.randn(2, 1, 16, 16, generator=g))


class _PINN(nn.Module):
    """Physics-informed net for Burgers' equation: u_t + u u_x - nu u_xx = 0, derivatives by autograd.grad
    with create_graph (double backward through tanh)."""

    def __init__(self, nu=0.01):
        super().__init__()
        self.nu = nu
        self.net = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, xt, boundary, u_boundary):
        xt = xt.clone().requires_grad_(True)
        u = self.net(xt)
        du = torch.autograd.grad(u.sum(), xt, create_graph=True)[0]
        u_x, u_t = du[:, :1], du[:, 1:]
        u_xx = torch.autograd.grad(u_x.sum(), xt, create_graph=True)[0][:, :1]
        residual = u_t + u * u_x - self.nu * u_xx
        return residual.pow(2).mean() + F.mse_loss(self.net(boundary), u_boundary)


def pinn_burgers():
    """A PINN (tanh MLP) whose loss holds first and second derivatives taken with torch.autograd.grad."""
    g = _gen()
    return _PINN(), (torch.rand(64, 2, generator=g), torch.rand(16, 2, generator=g), torch.rand(16, 1, generator=g))


# ---------------------------------------------------------------- signal and audio


class _STFTMask(nn.Module):
    """Speech enhancement by spectral masking: stft -> magnitude -> conv mask -> complex mask -> istft."""

    def __init__(self, n_fft=64, hop=16):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.mask = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))

    def forward(self, noisy, clean):
        spec = torch.stft(noisy, self.n_fft, self.hop, window=self.window, return_complex=True)
        mask = torch.sigmoid(self.mask(spec.abs().unsqueeze(1)).squeeze(1))
        est = torch.istft(spec * mask, self.n_fft, self.hop, window=self.window, length=noisy.shape[-1])
        return F.l1_loss(est, clean)


def stft_mask():
    """STFT/iSTFT masking net (torch.stft return_complex, complex x real mask, torch.istft), L1 on waveforms."""
    g = _gen()
    return _STFTMask(), (torch.randn(2, 512, generator=g), torch.randn(2, 512, generator=g))


class _MelCNN(nn.Module):
    """Keyword spotting on a log-mel front end built from torch ops (power spectrogram @ triangular filterbank)."""

    def __init__(self, n_fft=128, hop=32, mels=16, classes=5):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("fbank", self._filterbank(n_fft // 2 + 1, mels))
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(16, classes))

    @staticmethod
    def _filterbank(bins: int, mels: int) -> torch.Tensor:
        mel = torch.linspace(0, 2595 * math.log10(1 + 8000 / 700), mels + 2)
        hz = 700 * (10 ** (mel / 2595) - 1) / 8000 * (bins - 1)
        grid = torch.arange(bins, dtype=torch.float32).unsqueeze(1)
        lower = (grid - hz[:-2]) / (hz[1:-1] - hz[:-2])
        upper = (hz[2:] - grid) / (hz[2:] - hz[1:-1])
        return torch.clamp(torch.minimum(lower, upper), min=0)

    def forward(self, wave, labels):
        power = torch.stft(wave, self.n_fft, self.hop, window=self.window, return_complex=True).abs().pow(2)
        logmel = torch.log(torch.matmul(power.transpose(1, 2), self.fbank) + 1e-6).unsqueeze(1)
        return F.cross_entropy(self.net(logmel), labels)


def mel_cnn():
    """Log-mel spectrogram (torch.stft, |.|^2, mel filterbank matmul, log) into a small CNN classifier."""
    g = _gen()
    return _MelCNN(), (torch.randn(4, 1024, generator=g), torch.randint(0, 5, (4,), generator=g))


class _TasBlock(nn.Module):
    def __init__(self, channels: int, hidden: int, dilation: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(channels, hidden, 1), nn.PReLU(), nn.GroupNorm(1, hidden),
                                 nn.Conv1d(hidden, hidden, 3, padding=dilation, dilation=dilation, groups=hidden),
                                 nn.PReLU(), nn.GroupNorm(1, hidden), nn.Conv1d(hidden, channels, 1))

    def forward(self, x):
        return x + self.net(x)


class _ConvTasNet(nn.Module):
    """Conv-TasNet: learned conv encoder, TCN separator (depthwise dilated convs, PReLU, global layer norm),
    sigmoid masks, ConvTranspose1d decoder; negative SI-SNR loss."""

    def __init__(self, filters=32, kernel=16, sources=2):
        super().__init__()
        self.sources = sources
        self.encoder = nn.Conv1d(1, filters, kernel, stride=kernel // 2, bias=False)
        self.separator = nn.Sequential(nn.GroupNorm(1, filters), nn.Conv1d(filters, 16, 1),
                                       *[_TasBlock(16, 32, 2 ** i) for i in range(3)],
                                       nn.PReLU(), nn.Conv1d(16, filters * sources, 1))
        self.decoder = nn.ConvTranspose1d(filters, 1, kernel, stride=kernel // 2, bias=False)

    def forward(self, mixture, targets):
        w = F.relu(self.encoder(mixture.unsqueeze(1)))
        masks = torch.sigmoid(self.separator(w)).view(w.shape[0], self.sources, *w.shape[1:])
        est = self.decoder((masks * w.unsqueeze(1)).flatten(0, 1)).view(w.shape[0], self.sources, -1)
        est, targets = est - est.mean(-1, keepdim=True), targets - targets.mean(-1, keepdim=True)
        proj = (est * targets).sum(-1, keepdim=True) * targets / (targets.pow(2).sum(-1, keepdim=True) + 1e-8)
        si_snr = 10 * torch.log10(proj.pow(2).sum(-1) / ((est - proj).pow(2).sum(-1) + 1e-8) + 1e-8)
        return -si_snr.mean()


def conv_tasnet():
    """Conv-TasNet-like source separation on 2 x 512-sample mixtures, two sources, SI-SNR loss."""
    g = _gen()
    return _ConvTasNet(), (torch.randn(2, 512, generator=g), torch.randn(2, 2, 512, generator=g))


# ---------------------------------------------------------------- point clouds


class _PointNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv1d(3, 32, 1), nn.BatchNorm1d(32), nn.ReLU(),
                                 nn.Conv1d(32, 64, 1), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, classes))

    def forward(self, points, labels):
        return F.cross_entropy(self.head(self.mlp(points.transpose(1, 2)).amax(-1)), labels)


def pointnet():
    """PointNet classifier: shared per-point MLP (Conv1d k=1, BatchNorm1d), max over points, MLP head."""
    g = _gen()
    return _PointNet(), (torch.randn(4, 128, 3, generator=g), torch.randint(0, 4, (4,), generator=g))


class _DGCNN(nn.Module):
    """EdgeConv (DGCNN): k nearest neighbours from torch.cdist + topk, neighbour gather, max over edges."""

    def __init__(self, k=4, classes=4):
        super().__init__()
        self.k = k
        self.edge1 = nn.Sequential(nn.Conv2d(6, 32, 1), nn.BatchNorm2d(32), nn.LeakyReLU(0.2))
        self.edge2 = nn.Sequential(nn.Conv2d(64, 32, 1), nn.BatchNorm2d(32), nn.LeakyReLU(0.2))
        self.head = nn.Linear(64, classes)

    def _edge(self, x, conv):  # x: (B, N, C)
        idx = torch.cdist(x, x).topk(self.k, dim=-1, largest=False).indices  # (B, N, k)
        neighbours = torch.gather(x.unsqueeze(1).expand(-1, x.shape[1], -1, -1), 2,
                                  idx.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))
        centre = x.unsqueeze(2).expand_as(neighbours)
        feats = torch.cat([centre, neighbours - centre], -1).permute(0, 3, 1, 2)
        return conv(feats).amax(-1).transpose(1, 2)

    def forward(self, points, labels):
        h1 = self._edge(points, self.edge1)
        h2 = self._edge(h1, self.edge2)
        return F.cross_entropy(self.head(torch.cat([h1, h2], -1).amax(1)), labels)


def dgcnn():
    """DGCNN-style EdgeConv on 2 clouds of 24 points (cdist's direct path: at most 25 points)."""
    g = _gen()
    return _DGCNN(), (torch.randn(2, 24, 3, generator=g), torch.randint(0, 4, (2,), generator=g))


# ---------------------------------------------------------------- probabilistic and generative


class _Coupling(nn.Module):
    def __init__(self, dim: int, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 2 * dim))

    def forward(self, x):
        s, t = self.net(x * self.mask).chunk(2, -1)
        s = torch.tanh(s) * (1 - self.mask)
        return x * self.mask + (1 - self.mask) * (x * s.exp() + t), s.sum(-1)


class _RealNVP(nn.Module):
    """RealNVP: affine couplings with alternating masks, exact log-likelihood under a standard Normal."""

    def __init__(self, dim=4, layers=4):
        super().__init__()
        masks = [(torch.arange(dim) + i) % 2 for i in range(layers)]
        self.layers = nn.ModuleList(_Coupling(dim, m.float()) for m in masks)

    def forward(self, x):
        log_det = torch.zeros(x.shape[0], device=x.device)
        for layer in self.layers:
            x, ld = layer(x)
            log_det = log_det + ld
        log_prob = Independent(Normal(torch.zeros_like(x), torch.ones_like(x)), 1).log_prob(x) + log_det
        return -log_prob.mean()


def realnvp():
    """RealNVP normalizing flow (4 affine couplings) trained by maximum likelihood (torch.distributions.Normal)."""
    return _RealNVP(), torch.randn(32, 4, generator=_gen())


class _DistVAE(nn.Module):
    """A VAE written with torch.distributions: Normal posterior (rsample), Bernoulli likelihood, analytic KL."""

    def __init__(self, dim=64, latent=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, 64), nn.ReLU(), nn.Linear(64, dim))

    def forward(self, x):
        mu, log_std = self.enc(x).chunk(2, -1)
        q = Normal(mu, F.softplus(log_std) + 1e-4)
        z = q.rsample()
        recon = Independent(Bernoulli(logits=self.dec(z)), 1).log_prob(x)
        kl = kl_divergence(q, Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(-1)
        return (kl - recon).mean()


def dist_vae():
    """VAE with torch.distributions (Normal.rsample, Bernoulli.log_prob, kl_divergence) on binary 64-d data."""
    return _DistVAE(), torch.randint(0, 2, (8, 64), generator=_gen()).float()


class _SNGAN(nn.Module):
    """A DCGAN-style generator and a spectral-normalised discriminator, both losses in one step."""

    def __init__(self, latent=16):
        super().__init__()
        self.latent = latent
        self.gen = nn.Sequential(nn.Linear(latent, 32 * 4 * 4), nn.Unflatten(1, (32, 4, 4)),
                                 nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.BatchNorm2d(16), nn.ReLU(),
                                 nn.ConvTranspose2d(16, 1, 4, 2, 1), nn.Tanh())
        sn = nn.utils.spectral_norm
        self.disc = nn.Sequential(sn(nn.Conv2d(1, 16, 4, 2, 1)), nn.LeakyReLU(0.2),
                                  sn(nn.Conv2d(16, 32, 4, 2, 1)), nn.LeakyReLU(0.2), nn.Flatten(),
                                  sn(nn.Linear(32 * 4 * 4, 1)))

    def forward(self, real):
        fake = self.gen(torch.randn(real.shape[0], self.latent, device=real.device))
        ones = torch.ones(real.shape[0], 1, device=real.device)
        zeros = torch.zeros_like(ones)
        d_loss = F.binary_cross_entropy_with_logits(self.disc(real), ones) + \
            F.binary_cross_entropy_with_logits(self.disc(fake.detach()), zeros)
        return d_loss + F.binary_cross_entropy_with_logits(self.disc(fake), ones)


def sngan():
    """GAN with nn.utils.spectral_norm (power iteration on every discriminator call), 16x16 images."""
    return _SNGAN(), torch.rand(4, 1, 16, 16, generator=_gen()) * 2 - 1


class _ScoreNet(nn.Module):
    """Noise-conditional score model trained by denoising score matching (NCSN-style, Fourier noise embedding)."""

    def __init__(self, dim=2, width=64):
        super().__init__()
        self.register_buffer("freqs", torch.randn(8, generator=_gen()) * 4)
        self.net = nn.Sequential(nn.Linear(dim + 16, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                                 nn.Linear(width, dim))

    def forward(self, x):
        sigma = torch.exp(torch.empty(x.shape[0], 1, device=x.device).uniform_(math.log(0.01), math.log(1.0)))
        noise = torch.randn_like(x)
        angles = torch.log(sigma) * self.freqs
        score = self.net(torch.cat([x + sigma * noise, torch.sin(angles), torch.cos(angles)], -1)) / sigma
        return (sigma.pow(2) * (score + noise / sigma).pow(2)).sum(-1).mean()


def score_dsm():
    """Denoising score matching on 2-D points: log-uniform sigmas (uniform_), sin/cos embedding, SiLU MLP."""
    return _ScoreNet(), torch.randn(64, 2, generator=_gen())
