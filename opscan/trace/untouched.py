"""Trace stage: run a pre-pass that may write to the user's objects (torch.fx symbolic tracing) and put
back everything it set, so that the eager step afterwards sees the objects as the user built them.

symbolic_trace runs the model's forward with Proxies in place of tensors. A forward, or a helper object
it holds (a diffusers scheduler's `add_noise` does `self.alphas_cumprod = self.alphas_cumprod.to(...)`),
that stores a value on itself stores a Proxy there, and the real step then trips on it ("'len' is not
supported in symbolic tracing"). `untouched(root)` snapshots, before the pre-pass, every object reachable
from `root` through instance attributes and containers:

* an object with an instance `__dict__` (modules, plain helper objects; not tensors, classes, functions or
  Python modules): its attribute bindings;
* a list, dict or set: its items (in-place `append`, `update`, `add`);
* tuples and frozensets are walked, not snapshotted (they cannot change);

and afterwards restores, where the pre-pass changed them, exactly those bindings and items (a dict is
written to only when it differs, so a frozen mapping such as diffusers' FrozenDict config is never
written). The global CPU random state is restored too, so the eager step draws the numbers it would
have drawn with `--no-fx`. Not undone: in-place writes into tensor data, and state outside what `root`
reaches (module globals). The walk stops after MAX_OBJECTS objects (what it reached is still restored).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch

MAX_OBJECTS = 200_000
_OPAQUE = (torch.Tensor, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           torch.dtype, torch.device, str, bytes)


@contextlib.contextmanager
def untouched(root) -> Iterator[None]:
    """Snapshot what `root` reaches, run the block, restore every attribute and item the block changed."""
    saved = snapshot(root)
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        restore(saved)


def snapshot(root) -> list[tuple[object, object]]:
    """(object, copy of its state) for every mutable object reachable from `root`."""
    seen: set[int] = set()
    saved: list[tuple[object, object]] = []
    stack = [root]
    while stack and len(seen) < MAX_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE) or obj is None:
            continue
        seen.add(id(obj))
        state, children = _state(obj)
        if state is not None:
            saved.append((obj, state))
        stack.extend(children)
    return saved


def _state(obj) -> tuple[object, list]:
    """(a copy of the object's own state or None, the objects it holds)."""
    if isinstance(obj, dict):
        return dict(obj), list(obj.values())
    if isinstance(obj, list):
        return list(obj), list(obj)
    if isinstance(obj, set):
        return set(obj), list(obj)
    if isinstance(obj, (tuple, frozenset)):
        return None, list(obj)
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return _Attrs(dict(attrs)), list(attrs.values())
    return None, []


class _Attrs:
    """An object's instance attribute bindings (kept apart from a dict that is the object itself)."""

    __slots__ = ("items",)

    def __init__(self, items: dict):
        self.items = items


def restore(saved: list[tuple[object, object]]) -> None:
    """Put back every binding and item that differs from the snapshot."""
    for obj, state in saved:
        if isinstance(state, _Attrs):
            _restore_dict(obj.__dict__, state.items)
        elif isinstance(obj, dict):
            _restore_dict(obj, state)
        elif isinstance(obj, list):
            if len(obj) != len(state) or any(a is not b for a, b in zip(obj, state)):
                obj[:] = state
        elif isinstance(obj, set) and obj != state:
            obj.clear()
            obj.update(state)


def _restore_dict(current: dict, saved: dict) -> None:
    """Make `current` hold exactly `saved`'s keys, in its order, and values (by identity), writing only
    when something differs."""
    if list(current) == list(saved):
        for key, value in saved.items():
            if current[key] is not value:
                current[key] = value
        return
    current.clear()
    current.update(saved)
