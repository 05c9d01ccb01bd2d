"""Accept stage (hooks): what the run needs around the user's model — dropout off, TF32 off, capture.

- `NoDropout`: every nn.Dropout* module gets p = 0 and a TorchFunctionMode forces p = 0 in functional
  dropout and `scaled_dot_product_attention(dropout_p=...)`: identical masks cannot be drawn from two
  devices' own generators, so dropout is disabled on both (and the result says so).
- `numerics`: TF32 off on cuda unless allowed, cuDNN deterministic and not benchmarking, float32 matmul
  precision "highest"; restored on exit.
- `ModuleOutputs`: the first floating output of every module in the order the forwards finish, kept on
  the CPU within a byte budget, to name the module where an output first diverges.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from opscan.trace.guard import call_through
from opscan.trace.step import floating_outputs

_DROPOUT_ARG = {"dropout": ("p", 1), "dropout1d": ("p", 1), "dropout2d": ("p", 1), "dropout3d": ("p", 1),
                "alpha_dropout": ("p", 1), "feature_alpha_dropout": ("p", 1), "feature_dropout": ("p", 1),
                "dropout_": ("p", 1), "scaled_dot_product_attention": ("dropout_p", 4)}
MODULE_OUTPUT_BUDGET = 512 << 20  # bytes of module outputs kept per device run, for localisation


class NoDropout(TorchFunctionMode):
    """Force p = 0 in functional dropout and SDPA's dropout_p; counts the calls it changed."""

    def __init__(self):
        super().__init__()
        self.changed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name, index = _DROPOUT_ARG.get(getattr(func, "__name__", ""), (None, 0))
        if name is not None:
            args, kwargs, changed = _zero_argument(args, kwargs, name, index)
            self.changed += changed
        return call_through(func, *args, **kwargs)  # the user's call: its errors are theirs


def _zero_argument(args: tuple, kwargs: dict, name: str, index: int) -> tuple[tuple, dict, bool]:
    """Set the dropout probability (keyword `name` or positional `index`) to 0; says if it was > 0."""
    if name in kwargs:
        changed = bool(kwargs[name])
        kwargs[name] = 0.0
    elif len(args) > index and isinstance(args[index], (int, float)):
        changed = bool(args[index])
        args = (*args[:index], 0.0, *args[index + 1:])
    else:
        changed = False
    return args, kwargs, changed


def disable_dropout_modules(model: torch.nn.Module) -> int:
    """Set p = 0 on every dropout module; returns how many had p > 0."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            module.p = 0.0
            changed += 1
    return changed


@contextlib.contextmanager
def numerics(allow_tf32: bool):
    """TF32 off (unless allowed), deterministic cuDNN, highest float32 matmul precision; restored after."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (cuda.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark,
             torch.get_float32_matmul_precision())
    cuda.allow_tf32, cudnn.allow_tf32 = allow_tf32, allow_tf32
    cudnn.deterministic, cudnn.benchmark = True, False
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        cuda.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved[:4]
        torch.set_float32_matmul_precision(saved[4])


class ModuleOutputs:
    """Forward hooks keeping each module's first floating output per forward (key: iteration)."""

    def __init__(self, model: torch.nn.Module, budget: int = MODULE_OUTPUT_BUDGET):
        self.model = model
        self.budget = budget
        self.kept = 0
        self.truncated = False
        self.current: Any = None
        self.by_forward: dict[Any, dict[str, torch.Tensor]] = {}
        self.activation_bytes: dict[Any, int] = {}
        self._handles: list = []

    def __enter__(self) -> ModuleOutputs:
        for path, module in self.model.named_modules():
            self._handles.append(module.register_forward_hook(self._hook(path or "(model)")))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def forward(self, key: Any) -> None:
        """Start a forward; its module outputs are kept under `key` (None: stop keeping)."""
        self.current = key
        self._seen: set[int] = set()
        if key is None:
            return
        self.by_forward.setdefault(key, {})
        self.activation_bytes.setdefault(key, 0)

    def _hook(self, path: str):
        def hook(_module, _args, output):
            if self.current is None:
                return
            tensors = floating_outputs(output)
            fresh = [t for t in tensors if t.untyped_storage().data_ptr() not in self._seen]
            self._seen.update(t.untyped_storage().data_ptr() for t in fresh)
            self.activation_bytes[self.current] += sum(t.untyped_storage().nbytes() for t in fresh)
            if not tensors:
                return
            kept = self.by_forward[self.current]
            name = path if path not in kept else f"{path}#{sum(k.split('#')[0] == path for k in kept) + 1}"
            size = tensors[0].numel() * tensors[0].element_size()
            if self.kept + size > self.budget:
                self.truncated = True
                return
            self.kept += size
            kept[name] = tensors[0].detach().to("cpu", copy=True)
        return hook
