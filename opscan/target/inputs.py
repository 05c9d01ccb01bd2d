"""Target stage: `--input SHAPE:DTYPE[:LOW-HIGH]` and `--arg key=value` parsing (no torch import)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from opscan.errors import UsageError

DTYPES = (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128",
)
_INPUT = re.compile(r"^(?P<shape>\d+(?:x\d+)*|scalar):(?P<dtype>[a-z0-9]+)(?::(?P<low>-?\d+)-(?P<high>-?\d+))?$")


@dataclass(frozen=True)
class InputSpec:
    """One random input tensor: shape, dtype and, for integers, the [low, high) range."""

    shape: tuple[int, ...]
    dtype: str
    low: int = 0
    high: int = 2


def parse_input(text: str) -> InputSpec:
    """"1x3x224x224:float32" or "8x128:int64:0-30522" -> InputSpec."""
    match = _INPUT.match(text.strip())
    if not match or match["dtype"] not in DTYPES:
        raise UsageError(
            f"--input {text!r} is malformed — write SHAPE:DTYPE like 1x3x224x224:float32, "
            f"or 8x128:int64:0-30522 for integer ranges; dtypes: {', '.join(DTYPES)}"
        )
    shape = () if match["shape"] == "scalar" else tuple(int(d) for d in match["shape"].split("x"))
    low = int(match["low"]) if match["low"] is not None else 0
    high = int(match["high"]) if match["high"] is not None else 2
    if high <= low:
        raise UsageError(
            f"--input {text!r}: the range LOW-HIGH needs LOW < HIGH — e.g. 8x128:int64:0-30522 (HIGH is exclusive)"
        )
    return InputSpec(shape, match["dtype"], low, high)


def parse_arg(text: str) -> tuple[str, Any]:
    """"key=value" -> (key, literal value or string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"--arg {text!r} is malformed — write KEY=VALUE, e.g. --arg num_classes=10")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def random_inputs(specs: list[InputSpec]):
    """Seeded random tensors for the specs: one tensor, or a tuple of them."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tensors = []
    for spec in specs:
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point or dtype.is_complex:
            tensors.append(torch.randn(spec.shape, generator=gen, dtype=dtype))
        elif dtype == torch.bool:
            tensors.append(torch.randint(0, 2, spec.shape, generator=gen).bool())
        else:
            tensors.append(torch.randint(spec.low, spec.high, spec.shape, generator=gen, dtype=dtype))
    return tensors[0] if len(tensors) == 1 else tuple(tensors)
