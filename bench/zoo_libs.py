"""Factories for the zoo's models built with their domains' own libraries (issue 25): PyTorch Geometric (graphs),
e3nn (equivariant nets), torchdiffeq (neural ODEs), GPyTorch (Gaussian processes), zuko (normalizing flows) and
diffusers (a diffusion UNet with its scheduler). Tiny configs, random weights, nothing downloaded. The versions
are pinned in constraints/torch-2.14.1.txt and installed by the `zoo` extra (pyproject.toml); CI does not install
them, so these entries live in the bench manifest only.

Each factory returns `(model, example_inputs)`; the model's forward returns the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _graph(nodes=12, edges=30, features=16):
    g = _gen()
    return (torch.randn(nodes, features, generator=g), torch.randint(0, nodes, (2, edges), generator=g),
            torch.randint(0, 4, (nodes,), generator=g))


# ---------------------------------------------------------------- PyTorch Geometric


class _PygNodeClassifier(nn.Module):
    """Two message-passing layers of one PyG conv class, node classification (cross-entropy)."""

    def __init__(self, conv: str, width=16, classes=4):
        super().__init__()
        import torch_geometric.nn as pyg

        if conv == "gcn":
            self.c1, self.c2 = pyg.GCNConv(width, width), pyg.GCNConv(width, classes)
        elif conv == "gat":
            self.c1, self.c2 = pyg.GATConv(width, 8, heads=2), pyg.GATConv(16, classes, heads=1)
        else:
            self.c1, self.c2 = pyg.SAGEConv(width, width, aggr="mean"), pyg.SAGEConv(width, classes, aggr="max")

    def forward(self, x, edge_index, labels):
        h = F.elu(self.c1(x, edge_index))
        return F.cross_entropy(self.c2(F.dropout(h, 0.2, self.training), edge_index), labels)


def pyg_node(conv: str = "gcn"):
    """PyG GCNConv / GATConv / SAGEConv (`conv`: gcn, gat, sage) node classifier on 12 nodes, 30 edges."""
    return _PygNodeClassifier(conv), _graph()


class _PygGIN(nn.Module):
    """Graph classification: GINConv layers over a batch of 3 graphs, global_add_pool, MLP head."""

    def __init__(self, width=16, classes=2):
        super().__init__()
        import torch_geometric.nn as pyg

        mlp = lambda i, o: nn.Sequential(nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(), nn.Linear(o, o))  # noqa: E731
        self.c1, self.c2 = pyg.GINConv(mlp(width, 32)), pyg.GINConv(mlp(32, 32))
        self.pool = pyg.global_add_pool
        self.head = nn.Linear(32, classes)

    def forward(self, x, edge_index, batch, labels):
        h = self.c2(self.c1(x, edge_index).relu(), edge_index).relu()
        return F.cross_entropy(self.head(self.pool(h, batch, size=3)), labels)


def pyg_gin():
    """PyG GINConv + global_add_pool graph classifier on a batch of 3 graphs (5, 4, 3 nodes)."""
    x, edges, _ = _graph(nodes=12, edges=24)
    batch = torch.tensor([0] * 5 + [1] * 4 + [2] * 3)
    edges = edges[:, batch[edges[0]] == batch[edges[1]]]  # keep edges inside a graph
    return _PygGIN(), (x, edges, batch, torch.tensor([0, 1, 0]))


# ---------------------------------------------------------------- e3nn


class _E3Conv(nn.Module):
    """An E(3)-equivariant point convolution (tensor field network): spherical harmonics of edge vectors, a
    radial MLP giving the weights of a FullyConnectedTensorProduct, scatter-sum to the nodes, invariant energy."""

    def __init__(self):
        super().__init__()
        from e3nn import o3
        from e3nn.nn import FullyConnectedNet

        self.irreps_sh = o3.Irreps.spherical_harmonics(2)
        self.irreps_in, self.irreps_out = o3.Irreps("4x0e"), o3.Irreps("4x0e + 2x1o")
        self.tp = o3.FullyConnectedTensorProduct(self.irreps_in, self.irreps_sh, self.irreps_out,
                                                 shared_weights=False)
        self.radial = FullyConnectedNet([8, 16, self.tp.weight_numel], torch.nn.functional.silu)
        self.energy = o3.Linear(self.irreps_out, "0e")
        self.embed = nn.Embedding(3, 4)

    def forward(self, pos, species, edge_src, edge_dst, energy):
        from e3nn import o3
        from e3nn.math import soft_one_hot_linspace

        vec = pos[edge_dst] - pos[edge_src]
        sh = o3.spherical_harmonics(self.irreps_sh, vec, normalize=True, normalization="component")
        basis = soft_one_hot_linspace(vec.norm(dim=1), 0.0, 3.0, 8, basis="smooth_finite", cutoff=True)
        messages = self.tp(self.embed(species)[edge_src], sh, self.radial(basis))
        nodes = torch.zeros(pos.shape[0], messages.shape[1], device=pos.device).index_add(0, edge_dst, messages)
        return F.mse_loss(self.energy(nodes).sum(), energy)


def e3nn_conv():
    """e3nn tensor-field-network convolution (o3.spherical_harmonics, FullyConnectedTensorProduct) on 8 atoms."""
    g = _gen()
    pos = torch.randn(8, 3, generator=g)
    src, dst = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    keep = src != dst
    return _E3Conv(), (pos, torch.randint(0, 3, (8,), generator=g), src[keep], dst[keep], torch.tensor(1.0))


# ---------------------------------------------------------------- torchdiffeq


class _ODEFunc(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, dim))

    def forward(self, t, y):
        return self.net(y)


class _NeuralODE(nn.Module):
    """A neural ODE fitted to a trajectory: torchdiffeq.odeint (or odeint_adjoint) with a fixed-step RK4 solver."""

    def __init__(self, adjoint: bool = False):
        super().__init__()
        from torchdiffeq import odeint, odeint_adjoint  # imported here: its module-level float64 tables are not
        # part of the step (they stay on the CPU, as on a Mac)

        self.func, self.solve = _ODEFunc(), odeint_adjoint if adjoint else odeint

    def forward(self, y0, times, trajectory):
        return F.mse_loss(self.solve(self.func, y0, times, method="rk4", options={"step_size": 0.25}), trajectory)


def neural_ode(adjoint: bool = False):
    """Neural ODE (torchdiffeq, RK4, step 0.25 over 5 time points); `adjoint` backpropagates by the adjoint ODE."""
    g = _gen()
    return _NeuralODE(adjoint), (torch.randn(8, 4, generator=g), torch.linspace(0, 1, 5),
                                 torch.randn(5, 8, 4, generator=g))


# ---------------------------------------------------------------- GPyTorch


class _ExactGPLoss(nn.Module):
    """GPyTorch exact GP regression (constant mean, scaled RBF kernel, Gaussian likelihood): the negative exact
    marginal log likelihood, as a GP's training loop minimises it."""

    def __init__(self, train_x, train_y):
        super().__init__()
        import gpytorch

        class GP(gpytorch.models.ExactGP):
            def __init__(self, x, y, likelihood):
                super().__init__(x, y, likelihood)
                self.mean = gpytorch.means.ConstantMean()
                self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))

        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.gp = GP(train_x, train_y, self.likelihood)
        self.mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.likelihood, self.gp)

    def forward(self, x, y):
        import gpytorch

        with gpytorch.settings.debug(False):  # the scan may hand copies of the training inputs
            self.gp.set_train_data(x, y, strict=False)
            return -self.mll(self.gp(x), y)


def gpytorch_exact_gp():
    """GPyTorch ExactGP (ScaleKernel(RBF), GaussianLikelihood) on 32 points: Cholesky-based marginal likelihood."""
    g = _gen()
    x = torch.rand(32, 1, generator=g)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(32, generator=g)
    return _ExactGPLoss(x, y), (x, y)


# ---------------------------------------------------------------- zuko


class _ZukoFlow(nn.Module):
    """A zuko conditional flow trained by maximum likelihood: NSF (monotonic rational-quadratic splines,
    searchsorted) or MAF (affine autoregressive)."""

    def __init__(self, kind: str = "nsf"):
        super().__init__()
        import zuko

        make = zuko.flows.NSF if kind == "nsf" else zuko.flows.MAF
        self.flow = make(features=3, context=2, transforms=2, hidden_features=(32, 32))

    def forward(self, x, context):
        return -self.flow(context).log_prob(x).mean()


def zuko_flow(kind: str = "nsf"):
    """zuko NSF or MAF (`kind`) on 3-d samples with a 2-d context, batch 16."""
    g = _gen()
    return _ZukoFlow(kind), (torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g))


# ---------------------------------------------------------------- diffusers


class _DDPMStep(nn.Module):
    """One DDPM training step: diffusers' DDPMScheduler.add_noise at random timesteps, UNet2DModel (down/up
    blocks with attention) predicting the noise, MSE."""

    def __init__(self):
        super().__init__()
        from diffusers import DDPMScheduler, UNet2DModel

        self.unet = UNet2DModel(sample_size=16, in_channels=1, out_channels=1, layers_per_block=1,
                                block_out_channels=(16, 32), norm_num_groups=8,
                                down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=8)
        self.scheduler = DDPMScheduler(num_train_timesteps=100)

    def forward(self, images, noise, timesteps):
        noisy = self.scheduler.add_noise(images, noise, timesteps)
        return F.mse_loss(self.unet(noisy, timesteps).sample, noise)


def ddpm_unet():
    """diffusers UNet2DModel (2 levels, attention blocks) + DDPMScheduler.add_noise on 2 16x16 images."""
    g = _gen()
    return _DDPMStep(), (torch.randn(2, 1, 16, 16, generator=g), torch.randn(2, 1, 16, 16, generator=g),
                         torch.randint(0, 100, (2,), generator=g))
