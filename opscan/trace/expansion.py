"""Trace stage: a composite call re-dispatched to its composite kernel, so that its callees are recorded.

The recorder (recorder.py) asks, once per operator, whether a call should be expanded (composites without an MPS
kernel of their own); `run_expanded` then re-dispatches the call to its CompositeExplicitAutograd kernel inside the
(re-entered) recorder, whose callees are recorded with the composite call as their parent. A CPU fast path that
dispatches nothing is run again on meta copies, whose non-CPU branch (the one MPS takes) dispatches.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._pytree import tree_map

from opscan.trace.tensors import tensors_in


def run_expanded(recorder, func, index: int, args, kwargs) -> tuple[object, bool]:
    """(the call's result, whether its callees were recorded) for the call at `index` of `recorder.calls`."""
    if _is_view(func):  # a composite view only rewrites metadata: no callee dispatches
        return recorder.through(func, args, kwargs), True
    key = _composite_key(func)
    if key is None:
        return recorder.through(func, args, kwargs), False
    recorder.parents.append(index)
    try:
        try:
            with recorder:
                out = func._op_dk(key, *args, **kwargs)
        except Exception:  # noqa: BLE001 - the composite kernel refused these arguments
            del recorder.calls[index + 1:]  # (e.g. a Python scalar the C++ schema wants as a Tensor)
            if recorder.event_marks is not None:
                del recorder.event_marks[index + 1:]
            return recorder.through(func, args, kwargs), False
        if len(recorder.calls) == index + 1:  # a CPU fast path dispatched nothing: see the device path
            # nothing dispatched on meta either: metadata only; the meta run failed: not known
            expanded = _expand_on_meta(recorder, func, key, args, kwargs)
            if _strayed(out, args, kwargs) and not func._schema.is_mutable:
                out = recorder.through(func, args, kwargs)  # C++ made a plain meta tensor of a fake one
            return out, expanded
        return out, True
    finally:
        recorder.parents.pop()


def _expand_on_meta(recorder, func, key, args, kwargs) -> bool:
    """Run the composite kernel on meta copies: its non-CPU branch (the one MPS takes) dispatches.
    True when that run succeeded. Under fake tensors the copies are plain meta tensors too (the fake
    mode is set aside for the run), as in a real trace."""
    outside_fake = unset_fake_temporarily() if _has_fake((args, kwargs)) else contextlib.nullcontext()
    with outside_fake:
        meta_args, meta_kwargs = tree_map(_to_meta, (args, kwargs))
        if "device" in meta_kwargs:
            meta_kwargs["device"] = torch.device("meta")
        try:
            with recorder:
                func._op_dk(key, *meta_args, **meta_kwargs)
        except Exception:  # noqa: BLE001 - no meta path: the callees stay unknown
            return False
    return True


@functools.lru_cache(maxsize=None)
def _composite_key(func) -> DispatchKey | None:
    """The composite key the op really has a kernel for (calling a missing one would crash)."""
    for key in (DispatchKey.CompositeExplicitAutograd, DispatchKey.CompositeExplicitAutogradNonFunctional):
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
            return key
    return None


@functools.lru_cache(maxsize=None)
def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _has_fake(value) -> bool:
    return any(isinstance(t, FakeTensor) for t in tensors_in(value))


def _strayed(out, args, kwargs) -> bool:
    """True when a composite's C++ fast path, run on fake tensors, returned a plain (meta) tensor:
    it built a new tensor from the fake one's storage without dispatching, outside the fake mode."""
    if not _has_fake((args, kwargs)):
        return False
    return any(not isinstance(t, FakeTensor) for t in tensors_in(out))
