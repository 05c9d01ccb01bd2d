"""Crafted steps for the placement model (tests/test_placement.py): one host tensor from each source, the fixed
version of each, and the exceptions MPS kernels make for CPU tensors."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LABELS = torch.tensor([1, 2])  # a module-level loss target: stays on the CPU on a Mac


class Embed(nn.Module):
    """Position ids from a factory without device=: nn.Embedding's index_select gets CPU indices."""

    def __init__(self, fixed=False):
        super().__init__()
        self.emb, self.pos, self.fixed = nn.Embedding(10, 4), nn.Embedding(8, 4), fixed

    def forward(self, x):
        ids = torch.arange(x.size(1), device=x.device) if self.fixed else torch.arange(x.size(1))
        return (self.emb(x) + self.pos(ids)).sum(-1)


class Scale(nn.Module):
    """An elementwise op with a factory's non-0-dim tensor (and a 0-dim one, which binary ops take)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.lin, self.fixed = nn.Linear(4, 4), fixed

    def forward(self, x):
        ones = torch.ones(4, device=x.device) if self.fixed else torch.ones(4)
        return self.lin(x) * ones * torch.tensor(2.0)


class Masked(nn.Module):
    """A causal mask kept as a plain tensor attribute (not a registered buffer): Module.to() leaves it behind."""

    def __init__(self, fixed=False):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        if fixed:
            self.register_buffer("mask", mask)
        else:
            self.mask = mask

    def forward(self, x):
        return self.lin(x).masked_fill(self.mask, 0.0)


class FromNumpy(nn.Module):
    """A tensor made with torch.from_numpy in the step (outside the dispatcher)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * torch.from_numpy(np.ones(4, dtype=np.float32))


class Derived(nn.Module):
    """A mask computed only from a host tensor: the comparison runs on the CPU, the fill meets MPS."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        keep = torch.rand(4, 4) > 0.5
        return self.lin(x).masked_fill(keep, 0.0)


class Exceptions(nn.Module):
    """CPU tensors MPS kernels take: indices of x[idx], a 0-dim value of x[idx] = v, 0-dim operands of where."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        picked = h[torch.tensor([0, 1])]
        h = h.clone()
        h[torch.tensor([2])] = torch.tensor(1.0)
        return picked.sum() + torch.where(h > 0, h, torch.tensor(0.0)).sum()


class Target0d(nn.Module):
    """A 0-dim CPU target handed to nll_loss (an MPSGraph kernel: it refuses a 0-dim CPU tensor too)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return F.nll_loss(F.log_softmax(self.lin(x)[0], -1), torch.tensor(1))


def embed():
    return Embed(), torch.randint(0, 10, (2, 5))


def embed_fixed():
    return Embed(fixed=True), torch.randint(0, 10, (2, 5))


def scale():
    return Scale(), torch.randn(2, 4)


def scale_fixed():
    return Scale(fixed=True), torch.randn(2, 4)


def masked():
    return Masked(), torch.randn(4, 4)


def masked_fixed():
    return Masked(fixed=True), torch.randn(4, 4)


def from_numpy():
    return FromNumpy(), torch.randn(2, 4)


def derived():
    return Derived(), torch.randn(4, 4)


def exceptions():
    return Exceptions(), torch.randn(4, 4)


def target_0d():
    return Target0d(), torch.randn(2, 4)


MODES_SEEN: list[int] = []  # the torch-function modes active while the model's forward ran


class ModeCounter(nn.Module):
    """Counts the TorchFunctionModes on while the trace runs its forward (the trace's should be one)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        MODES_SEEN.append(torch._C._len_torch_function_stack())
        return self.lin(x)


def mode_counter():
    return ModeCounter(), torch.randn(2, 4)


class Ctc(nn.Module):
    """CTC against CPU targets and lengths, which ctc_loss moves to the log-probabilities' device itself."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)

    def forward(self, x):
        logp = self.lin(x).log_softmax(-1)  # (T=6, N=2, C=5)
        targets = torch.tensor([[1, 2], [3, 4]])
        return F.ctc_loss(logp, targets, torch.full((2,), 6), torch.full((2,), 2))


class SetItem(nn.Module):
    """A Python scalar written into a device tensor (PyTorch makes it on that tensor's device)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x).clone()
        h[..., 0] = 3.0
        return h


def ctc():
    return Ctc(), torch.randn(6, 2, 4)


def set_item():
    return SetItem(), torch.randn(2, 4)


class HostThenMoved(nn.Module):
    """A mask computed on the CPU through composites (abs allocates its result inside) and moved before use, as
    transformers' LongT5 builds its local attention mask."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        rel = torch.arange(4, dtype=torch.int32) - 1
        keep = torch.abs(rel) < 2
        return self.lin(x).masked_fill(keep.to(x.device), 0.0)


def host_then_moved():
    return HostThenMoved(), torch.randn(2, 4)


class HostMetrics(nn.Module):
    """Metrics on the host: what `.cpu()` returns stays on the CPU, so float64 math on it runs on the CPU's kernels
    (a Mac has float64 there), not on MPS."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        out = self.lin(x)
        probs = out.detach().cpu().double().softmax(-1)
        return out.sum() + 0 * -probs.log().mean().item()


class HostCopyBack(nn.Module):
    """A statistic taken to the host with `.to("cpu")` and used with a device tensor again: the division raises on a
    Mac (a non-0-dim CPU tensor in a TensorIterator op on MPS)."""

    def __init__(self, fixed=False):
        super().__init__()
        self.lin, self.fixed = nn.Linear(4, 4), fixed

    def forward(self, x):
        out = self.lin(x)
        scale = out.detach().abs().amax(0) if self.fixed else out.detach().abs().amax(0).to("cpu")
        return (out / (scale + 1)).sum()


def host_metrics():
    return HostMetrics(), torch.randn(2, 4)


def host_copy_back():
    return HostCopyBack(), torch.randn(2, 4)


def host_copy_back_fixed():
    return HostCopyBack(fixed=True), torch.randn(2, 4)


class FromArray(nn.Module):
    """NumPy's float64 data brought to the device as float32 (an environment's observation): cast while moving,
    `torch.as_tensor(..., dtype=, device=)` and `torch.tensor(..., dtype=, device=)`; `keep_float64` leaves the
    dtype out, so a float64 tensor lands on MPS."""

    def __init__(self, keep_float64=False):
        super().__init__()
        self.lin, self.keep_float64 = nn.Linear(4, 4), keep_float64

    def forward(self, x):
        obs = np.linspace(0.0, 1.0, 8).reshape(2, 4)  # float64
        if self.keep_float64:
            return self.lin(x).sum() + torch.tensor(obs, device=x.device).sum()
        a = torch.from_numpy(obs).to(x.device, torch.float32)
        b = torch.as_tensor(obs, dtype=torch.float32, device=x.device)
        c = torch.tensor(obs, dtype=torch.float32, device=x.device)
        return self.lin(x + a + b + c).sum()


def from_array():
    return FromArray(), torch.randn(2, 4)


def from_array_float64():
    return FromArray(keep_float64=True), torch.randn(2, 4)


class HostDeviceOf(nn.Module):
    """timm's DINOv3 RoPE coordinate augmentation (timm/layers/pos_embed_sincos.py): a grid built on the CPU, a
    factor made with `device=coords.device` (the CPU on a Mac too), multiplied there, then moved to the model's
    device; `on_device` makes the factor with the input's device instead (a placement error on a Mac)."""

    def __init__(self, on_device=False):
        super().__init__()
        self.lin, self.on_device = nn.Linear(2, 2), on_device

    def forward(self, x):
        coords = torch.linspace(-1.0, 1.0, steps=6).reshape(3, 2)
        where = x.device if self.on_device else coords.device
        rescale = torch.empty(2, device=where, dtype=coords.dtype).uniform_(-0.5, 0.5).exp()
        coords = coords * rescale
        return self.lin(x) + coords.to(x.device)


def host_device_of():
    return HostDeviceOf(), torch.randn(3, 2)


def host_device_of_wrong():
    return HostDeviceOf(on_device=True), torch.randn(3, 2)
