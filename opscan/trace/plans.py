"""Trace stage: what the recorder needs to know of an operator, worked out once per operator.

The recorder and the memory tracker below it run for every dispatched call; what they ask of the operator itself
— its OpKey, whether its C++ composite kernel is what runs (`op` None: the recorder records what it runs instead),
whether it is a fake tensor's device query, a bookkeeping call, which of its parameters are plain `Tensor`s (a
composite's wrapped scalar comes back as a number there: scalars.py), whether it writes into an argument (an
out= variant or `resize_` can grow a storage) — depends on the operator alone. `plan_of(func)` answers it once per
operator and keeps the answer (`PLANS`, keyed by the operator's id and checked by identity: an OpOverload's own
hash is a Python method).
"""

from __future__ import annotations

import torch

from opscan.opkey import OpKey
from opscan.trace.bookkeeping import is_bookkeeping
from opscan.trace.scalars import tensor_parameters

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
DEVICE_QUERY = torch.ops.prim.device.default  # dispatched only by tensors with a Python device (fake)


class OpPlan:
    """The per-operator facts of one operator (module docstring)."""

    __slots__ = ("func", "op", "device_query", "bookkeeping", "numbers_at", "numbers_named", "grows",
                 "overwritten_at", "overwritten_named")

    def __init__(self, func):
        self.func = func
        self.device_query = func is DEVICE_QUERY
        self.op = None if self.device_query or is_composite(func) else OpKey.of(func)
        self.bookkeeping = self.op is not None and is_bookkeeping(self.op)
        positions, names = tensor_parameters(func) if self.op is not None else (frozenset(), frozenset())
        self.numbers_at = tuple(sorted(positions))  # positions of plain Tensor parameters (scalars.py)
        self.numbers_named = names
        schema = getattr(func, "_schema", None)
        self.grows = bool(schema is not None and schema.is_mutable)
        self.overwritten_at, self.overwritten_named = _overwritten(schema, self.op)


# in-place ops that write every element of `self` without reading it: their `self` holds whatever memory it was
# given (an `empty` copy_ writes into), so its values are not an input of the call
_FILLS = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                    "geometric_", "cauchy_", "log_normal_"})


def _overwritten(schema, op) -> tuple[tuple[int, ...], frozenset]:
    """(positions, keyword names) of the arguments a call writes without reading: out= arguments, and `self` of
    the fills above. Their values are uninitialised memory as often as not: argspec must not record them."""
    if schema is None or op is None:
        return (), frozenset()
    positions, names = [], set()
    for i, arg in enumerate(schema.arguments):
        if not (getattr(arg, "is_out", False) or (i == 0 and op.name in _FILLS and arg.name == "self")):
            continue
        if arg.kwarg_only:
            names.add(arg.name)
        else:
            positions.append(i)
    return tuple(positions), frozenset(names)


PLANS: dict[int, OpPlan] = {}


def plan_of(func) -> OpPlan:
    """The operator's plan, made the first time it is asked for (callers look `PLANS` up first)."""
    found = PLANS.get(id(func))
    if found is None or found.func is not func:
        found = PLANS[id(func)] = OpPlan(func)
    return found


def is_composite(func) -> bool:
    """True for an op whose C++ CompositeImplicitAutograd kernel is what runs when it reaches the recorder."""
    name = getattr(func, "name", None)
    try:
        return callable(name) and torch._C._dispatch_has_kernel_for_dispatch_key(name(), _COMPOSITE)
    except RuntimeError:  # an op the dispatcher does not know by name (prim::device)
        return False
