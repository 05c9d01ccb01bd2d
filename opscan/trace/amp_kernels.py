"""Trace stage: the AutocastMPS policy run at the AutocastCPU dispatch key, so a CPU trace casts as a Mac does.

While an autocast region read as MPS autocast (amp.py) runs, CPU autocast is on with MPS's dtype, and Python
kernels registered here at AutocastCPU replace torch's CPU policy by the predicted-for release's MPS policy:
- every op some release's AutocastMPS policy lists gets a kernel that asks the release for its cast policy
  (questions.py, asked per op as the step dispatches it) and, as at::autocast::WrapFunction_ does, casts its
  eligible inputs (floating, not float64) — lower_precision_fp to the autocast dtype, fp32 to float32, promote to
  the widest floating input — then calls the op with autocast excluded (the op's own callees are not cast again);
  an op the release does not list redispatches below autocast untouched, as MPS's fallthrough does, so the
  composites it calls still meet their own rules (conv3d's convolution is cast before 2.9, where conv3d has none);
- every op of the CPU policy that no MPS policy lists (the FFTs, ...) gets the untouched redispatch too, so it runs
  on the dtype that reaches it, as on MPS.
Because the kernels sit in the dispatcher they reach ops called from C++ composites as well as from Python.
Weights (leaf float32 tensors that require grad) are cast once per region, as autocast's cache does.

The CPU may refuse a dtype MPS accepts or refuses itself (a float16 or bfloat16 FFT): the refused call stays in
the trace as a raised call (the MPS view and the knowledge base judge it), and the step goes on with the op run in
float32 by the muted recorder, with a note. Registered on first use and removed when the trace ends.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch._C import DispatchKey, DispatchKeySet

from opscan.trace.guard import call_through

KEY = DispatchKey.AutocastCPU
_EXCLUDE = DispatchKeySet(KEY)
LOW = (torch.float16, torch.bfloat16)
TRACED_DEVICES = ("cpu", "meta")  # where the step's tensors live while it is traced or sized


@functools.lru_cache(maxsize=1)
def cpu_policy_ops() -> tuple[str, ...]:
    """The ops torch's own CPU autocast policy registers (asked before any kernel of ours is registered)."""
    names = torch._C._dispatch_get_all_op_names()
    return tuple(sorted(n.removeprefix("aten::") for n in names if n.startswith("aten::")
                        and torch._C._dispatch_has_kernel_for_dispatch_key(n, KEY)))


def register(tracer, mps_ops) -> torch.library.Library:
    """A Library with the kernels of the module docstring; `tracer` answers `cast_of(op)`, casts and guards."""
    cpu_policy_ops()
    library = torch.library.Library("aten", "IMPL")
    after = torch._C._dispatch_keyset_full_after(KEY)
    with warnings.catch_warnings():  # replacing torch's CPU policy is the point (2.13 warns once about it)
        warnings.filterwarnings("ignore", message=".*[Oo]verrid")
        for name in sorted(set(mps_ops) | set(cpu_policy_ops())):
            op = _overload(name)
            if op is None:
                continue  # an overload the installed torch no longer has (2.13 removed the Dimname ones)
            library.impl(name, _kernel(tracer, name, op, after, name in mps_ops), KEY.name, with_keyset=True)
    return library


def _kernel(tracer, name: str, op, after, listed: bool):
    def kernel(keyset, *args, **kwargs):
        policy = tracer.cast_of(name) if listed else None
        if policy is None:
            return tracer.guarded(op, lambda: call_through(op.redispatch, keyset & after, *args, **kwargs),
                                  args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            cast_args, cast_kwargs = cast(policy, args, kwargs, torch.get_autocast_dtype("cpu"), tracer.cache)
            return tracer.guarded(op, lambda: call_through(op, *cast_args, **cast_kwargs), cast_args, cast_kwargs)
    return kernel


def cast(policy: str, args, kwargs, lower: torch.dtype, cache: dict):
    """The arguments as the policy casts them (at::autocast::cached_cast on each tensor, lists included)."""
    if policy == "lower_precision_fp":
        to = lower
    elif policy == "promote":
        to = _promoted(args, kwargs, lower)
    else:  # fp32 (MPS uses no fp32_set_opt_dtype / fp32_append_dtype rule)
        to = torch.float32
    convert = functools.partial(_cached_cast, to=to, lower=lower, cache=cache)
    return tuple(_each(a, convert) for a in args), {k: _each(v, convert) for k, v in kwargs.items()}


def to_float32(args, kwargs):
    """The arguments with their float16 / bfloat16 tensors in float32 (the stand-in for a refused call)."""
    def up(t):
        return t.float() if t.dtype in LOW else t
    return tuple(_each(a, up) for a in args), {k: _each(v, up) for k, v in kwargs.items()}


def low_precision(args, kwargs) -> bool:
    """True when a float16 or bfloat16 tensor is among the arguments."""
    return any(t.dtype in LOW for t in _tensors(args, kwargs))


def _eligible(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dtype != torch.float64 and t.device.type in TRACED_DEVICES


def _cached_cast(t: torch.Tensor, to, lower, cache: dict) -> torch.Tensor:
    if not _eligible(t) or t.dtype == to:
        return t
    cacheable = (to == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
                 and torch.is_autocast_cache_enabled())
    if cacheable and id(t) in cache and cache[id(t)][0] is t:
        return cache[id(t)][1]
    out = t.to(to)
    if cacheable:
        cache[id(t)] = (t, out)  # the source is kept alive with its cast, so its id is not reused
    return out


def _promoted(args, kwargs, lower: torch.dtype) -> torch.dtype:
    """at::autocast::promote_type: float32 when any eligible input is float32, else the lower precision."""
    found = {t.dtype for t in _tensors(args, kwargs) if _eligible(t)}
    return torch.float32 if torch.float32 in found else lower


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _each(value, convert):
    if isinstance(value, torch.Tensor):
        return convert(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(convert(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _overload(name: str):
    packet, _, overload = name.partition(".")
    found = getattr(torch.ops.aten, packet, None)
    try:
        return getattr(found, overload or "default") if found is not None else None
    except AttributeError:
        return None
