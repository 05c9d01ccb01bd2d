"""Trace stage: tensors the user's own code makes on the host, seen where the CPU trace cannot tell them apart.

At the dispatcher `torch.linspace(0, 1, 5)` and `torch.linspace(0, 1, 5, device=x.device)` are the same call
in a CPU trace, but on a Mac only the second lands on MPS. `HostFactories` (a job of the trace's one
TorchFunctionMode, trace/functions.py) sees the Python call: a factory called without `device=` (and no default
device set) makes a tensor that stays on the CPU while the step runs on MPS, and its storage is marked so in the trace's
StoragePlaces (trace/tensors.py). That is what lets a condition see a CPU tensor meet an MPS tensor in one call
(a scheduler's `sigmas[i]` multiplying an MPS latent).
"""

from __future__ import annotations

import torch

_FACTORIES = frozenset(f for f in (
    torch.tensor, torch.as_tensor, torch.linspace, torch.logspace, torch.arange, torch.zeros, torch.ones,
    torch.full, torch.empty, torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye,
    torch.scalar_tensor) if f is not None)


class HostFactories:
    """Marks the storage of a tensor made by a Python factory without `device=` as on the host."""

    funcs = _FACTORIES

    def __init__(self, storages):
        self.storages = storages  # the recorder's StorageIds (its StoragePlaces)

    def wrap(self, inner):
        """The chain link for the factories (trace/functions.py)."""
        def run(func, args, kwargs):
            out = inner(func, args, kwargs)  # the user's call: its errors are theirs
            placement = self.storages.placement
            if kwargs.get("device") is None and placement.tracking and isinstance(out, torch.Tensor) \
                    and _default_is_cpu():
                sid = self.storages.of(out)
                placement.made.add(sid)
                placement.host.add(sid)
            return out
        return run


def _default_is_cpu() -> bool:
    get = getattr(torch, "get_default_device", None)  # torch 2.3+
    return get is None or get().type in ("cpu", "meta")
