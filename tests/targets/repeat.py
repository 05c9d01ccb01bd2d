"""Test targets for repeated layers traced once (opscan/trace/repeat.py): stacks of alike and unalike layers.

`build_model` is a crafted stack of alike blocks; `alternating` one whose layers read their index (every
`period`-th layer gates its output); `qwen_alternating` a transformers Qwen2 from a config whose layers
alternate sliding-window and full attention; `by_class` a stack whose layers are of two classes.
"""

import torch
from torch import nn


class Block(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual; every `alternate`-th layer also gates."""

    def __init__(self, width: int, layer_idx: int, alternate: int = 0):
        super().__init__()
        self.layer_idx, self.alternate = layer_idx, alternate
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        y = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        if self.alternate and self.layer_idx % self.alternate == self.alternate - 1:
            y = y * torch.sigmoid(y)
        return x + y


class Stack(nn.Module):
    """An embedding, `layers` blocks in a ModuleList and a head."""

    def __init__(self, layers: int, alternate: int = 0, width: int = 16, other: type | None = None):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(
            (other(width) if other is not None and i % 2 else Block(width, i, alternate)) for i in range(layers))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _inputs():
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))


def build_model(layers: int = 6):
    """Alike blocks."""
    return Stack(layers), _inputs()


def alternating(layers: int = 6, period: int = 2):
    """Every `period`-th layer gates its output (odd layers by default): layer_idx changes the ops."""
    return Stack(layers, alternate=period), _inputs()


def by_class(layers: int = 6):
    """Every other layer a plain Linear-GELU block of another class."""
    class Other(nn.Sequential):
        def __init__(self, width):
            super().__init__(nn.Linear(width, width), nn.GELU())
    return Stack(layers, other=Other), _inputs()


def qwen_alternating(layers: int = 6):
    """A Qwen2 causal LM whose layers alternate sliding-window and full attention (config.layer_types)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    types = ["sliding_attention" if i % 2 else "full_attention" for i in range(layers)]
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=layers, vocab_size=100, max_position_embeddings=64, use_sliding_window=True,
                      sliding_window=4, max_window_layers=0, layer_types=types, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids.clone()}


class _Rotate(nn.Module):
    """A stateless function wrapped as a module, as transformers 5.25's `use_kernelized_func` (the `kernels`
    package) gives each attention layer its own instance in a plain dict, `_kernel_funcs`: not a submodule."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.roll(x, 1, dims=-1) * self.scale


class KernelBlock(Block):
    """A Block that holds its own `_Rotate` in a dict attribute (a new instance per layer)."""

    def __init__(self, width: int, layer_idx: int, scale: float = 1.0):
        super().__init__(width, layer_idx)
        self.__dict__.setdefault("_kernel_funcs", {})["rotate"] = _Rotate(scale)

    def forward(self, x):
        return super().forward(self._kernel_funcs["rotate"](x))


def kernel_funcs(layers: int = 6, odd_scale: float = 1.0):
    """Blocks that each hold a per-instance wrapped function in a dict; `odd_scale` != 1 makes odd layers'
    wrappers differ (they are then not alike)."""
    model = Stack(layers)
    model.layers = nn.ModuleList(KernelBlock(16, i, odd_scale if i % 2 else 1.0) for i in range(layers))
    return model, _inputs()
