"""Target stage: `--input SHAPE:DTYPE[:LOW-HIGH]` and `--arg key=value` parsing (no torch import), and the
`--arg` words of a command line opscan records (a report's repro command, ISSUE.md, an acceptance package):
argument names only — `--arg token=<redacted>` — unless the user marks the name public (`--public-arg NAME`),
since a factory argument may be a credential and ISSUE.md is written for a public tracker."""

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
MAX_TEXT = 200  # characters of an --input: more is not a shape anyone means (and int() of huge digit runs is slow)
MAX_ELEMENTS = 1 << 62  # a tensor's element count must fit torch's int64 sizes
# the [low, high) torch.randint accepts per integer dtype: high up to max + 1, except int64 (an int64 argument)
INT_RANGES = {"int64": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), 1 << 31), "int16": (-(1 << 15), 1 << 15),
              "int8": (-128, 128), "uint8": (0, 256)}


@dataclass(frozen=True)
class InputSpec:
    """One random input tensor: shape, dtype and, for integers, the [low, high) range."""

    shape: tuple[int, ...]
    dtype: str
    low: int = 0
    high: int = 2


def parse_input(text: str) -> InputSpec:
    """"1x3x224x224:float32" or "8x128:int64:0-30522" -> InputSpec."""
    match = _INPUT.match(text.strip()) if len(text) <= MAX_TEXT else None
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
    _check_limits(text, shape, match["dtype"], low, high)
    return InputSpec(shape, match["dtype"], low, high)


def _check_limits(text: str, shape: tuple[int, ...], dtype: str, low: int, high: int) -> None:
    """A shape a tensor can have, and integers the dtype can hold."""
    elements = 1
    for size in shape:
        elements *= size
    if elements > MAX_ELEMENTS:
        raise UsageError(f"--input {text!r}: {elements:.3g} elements is more than a tensor can hold (2**62) — pass a "
                         "smaller shape")
    lowest, highest = INT_RANGES.get(dtype, (low, high))
    if low < lowest or high > highest:
        raise UsageError(f"--input {text!r}: for {dtype}, LOW-HIGH must lie within {lowest}-{highest} (HIGH is "
                         "exclusive) — pass a range that fits, or a wider dtype")


def parse_arg(text: str) -> tuple[str, Any]:
    """"key=value" -> (key, literal value or string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"--arg {text!r} is malformed — write KEY=VALUE, e.g. --arg num_classes=10")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError):
        return key, raw  # not a literal: kept as a string
    except (RecursionError, MemoryError):
        raise UsageError(f"--arg {key}=…: the value ({len(raw)} characters) is nested too deeply to read as a Python "
                         "literal — pass a simpler value (numbers, strings, tuples, lists, dicts)") from None


REDACTED = "<redacted>"


def public_name(text: str) -> str:
    """`--public-arg NAME`: the name of an --arg whose value may be recorded."""
    if not text.isidentifier():
        raise UsageError(f"--public-arg {text!r} is not an argument name — write the KEY of an --arg KEY=VALUE, "
                         "e.g. --public-arg num_classes")
    return text


def arg_words(args: dict[str, Any], public=()) -> list[str]:
    """The `--arg` words of a recorded command line: `KEY=<redacted>` unless KEY is public (then `KEY=repr`), and
    a `--public-arg KEY` for each public one given, so the line parses back to the same marking."""
    words = [w for key, value in args.items()
             for w in ("--arg", f"{key}={value!r}" if key in public else f"{key}={REDACTED}")]
    return words + [w for key in args if key in public for w in ("--public-arg", key)]


def redacted_argv(argv: list[str], public=()) -> list[str]:
    """A command line as typed (sys.argv) with the value of every --arg whose name is not public redacted."""
    out, after_arg = [], False
    for word in argv:
        if after_arg or word.startswith("--arg="):
            head, text = ("", word) if after_arg else ("--arg=", word[len("--arg="):])
            key, sep, _ = text.partition("=")
            word = head + (text if key in public or not sep else f"{key}={REDACTED}")
        after_arg = word == "--arg"
        out.append(word)
    return out


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
