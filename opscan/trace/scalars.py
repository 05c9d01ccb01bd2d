"""Trace stage: Python scalars that arrive where an op's schema wants a Tensor.

A composite called with a Python scalar (`x % 3` is `remainder.Scalar`) wraps it in a 0-dim CPU tensor
marked as a "wrapped number" and calls the Tensor overload (`remainder(self, wrapped_scalar_tensor(other))`).
When the recorder re-runs the composite to see its callees, that callee reaches the dispatch mode with the
wrapped number turned back into a Python scalar (a wrapped number is boxed as a number), and calling it with
a number where the schema wants a Tensor raises — except for the few ops whose Python binding takes numbers
as tensors and wraps them itself (`add`, `mul`, `div`, `sub`, ...: torch/csrc/utils/python_arg_parser.cpp
`should_allow_numbers_as_tensors`, asked through `torch._C`), which are left as they are. Here the number
becomes a 0-dim CPU tensor again, of the dtype the call computes in (`torch.result_type` of a tensor argument
and the number): that is what a wrapped number takes part in, and what an MPS binary kernel casts it to. (Its
own dtype, int64 or float64, would read as a float64 input that MPS can't take; Python has no way to set the
wrapped-number flag.)
"""

from __future__ import annotations

import functools
import numbers

import torch

_ALLOWED = getattr(torch._C, "_should_allow_numbers_as_tensors", lambda name: False)


def rewrapped(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args`/`kwargs` with each number in a Tensor-typed parameter made a 0-dim tensor (see above)."""
    positions, names = tensor_parameters(func)
    if not any(_is_number(args[i]) for i in positions if i < len(args)) and \
            not any(_is_number(kwargs.get(n)) for n in names):
        return args, kwargs
    reference = _reference(args, kwargs)
    args = tuple(_tensor(v, reference) if i in positions and _is_number(v) else v for i, v in enumerate(args))
    kwargs = {k: _tensor(v, reference) if k in names and _is_number(v) else v for k, v in kwargs.items()}
    return args, kwargs


def numbers_in(positions, names, args: tuple, kwargs: dict) -> bool:
    """Whether a number sits in one of the Tensor-typed parameters (`positions`, `names`: `tensor_parameters`'s),
    that is whether `rewrapped` changes the call (a tensor or None is read by its type alone)."""
    count = len(args)
    for i in positions:  # (a tensor or None, most arguments, is told by its type without a call)
        if i < count and type(args[i]) not in _NOT_NUMBERS and _number(args[i]):
            return True
    return any(_number(kwargs.get(n)) for n in names) if names else False


def _number(value) -> bool:
    kind = type(value)
    if kind in _NOT_NUMBERS:
        return False
    return kind in _NUMBERS or _is_number(value)


_NUMBERS = frozenset({int, float, bool, complex})
_NOT_NUMBERS = frozenset({torch.Tensor, torch.nn.Parameter, type(None)})


@functools.lru_cache(maxsize=None)
def tensor_parameters(func) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of the parameters typed plain `Tensor` in the op's schema."""
    schema = getattr(func, "_schema", None)
    if schema is None or _ALLOWED(schema.name.partition("::")[2]):
        return frozenset(), frozenset()
    found = [(i, a.name) for i, a in enumerate(schema.arguments) if isinstance(a.type, torch.TensorType)]
    return frozenset(i for i, _ in found), frozenset(n for _, n in found)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, torch.Tensor)


def _reference(args, kwargs) -> torch.Tensor | None:
    """The tensor argument the number is promoted with: the first non-bool one, else the first."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    return next((t for t in tensors if t.dtype != torch.bool), tensors[0] if tensors else None)


def _tensor(number, reference: torch.Tensor | None) -> torch.Tensor:
    dtype = torch.result_type(reference, number) if reference is not None else None
    return torch.tensor(number, dtype=dtype, device="cpu")
