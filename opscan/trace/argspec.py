"""Trace stage: a replayable, JSON-safe description of one call's arguments (for measured mode).

`encode(args, kwargs)` walks the positional and keyword arguments of a dispatched call and returns
`{"args": [...], "kwargs": {...}}` where every value is plain JSON:

Encoding, per argument:
- tensor: `{"t": i}`, the i-th tensor of the call in the order of `OpCall.inputs`; integer and bool
  tensors of at most `VALUE_CAP` elements also carry `"v"`, their values (row-major, as `tolist()`);
- None, bool, int, str, finite float: itself;
- inf / nan, complex: `{"float": "inf"}`, `{"complex": [re, im]}`;
- dtype, device, layout, memory_format: `{"dtype": "float32"}`, `{"device": "cpu"}`,
  `{"layout": "strided"}`, `{"memory_format": "contiguous_format"}`;
- Generator: `{"generator": "cpu"}` (replayed as a fresh seeded generator);
- list / tuple (TensorList, int[], optional tensors): a JSON list of the above;
- anything else (SymInt without a value, a ProcessGroup, ...): `{"unsupported": "TypeName"}`, and
  the call cannot be replayed.

Pure: it reads the arguments and changes nothing. Values are never recorded for fake or meta
tensors (they have none): probe-input builders in op_probes/ make valid ones instead.

`attrs(args, kwargs)` is the display form (`OpCall.attrs`): positional then keyword values, tensors as
"<tensor>", dtypes and devices as their names, lists as lists, other objects by type name. `read_call(args,
kwargs)` gives a recorded call's tensors (`tensors_in`'s order), attrs and spec in one walk over its arguments
(the recorder's per-call path); arguments of a kind it does not know (a dict, a symbolic size, a generator) take
the three walks above instead, so the results are the same either way.
"""

from __future__ import annotations

import math

import torch

from opscan.trace.tensors import tensors_in

VALUE_CAP = 1 << 16  # integer/bool tensors with more elements keep no values
VERSION = 1

_INT_LIKE = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def encode(args, kwargs, value_cap: int = VALUE_CAP) -> dict:
    """The replayable form of one call's arguments (see the module docstring)."""
    counter = [0]
    return {
        "args": [_encode(a, counter, value_cap) for a in args],
        "kwargs": {k: _encode(v, counter, value_cap) for k, v in kwargs.items()},
    }


def attrs(args, kwargs) -> tuple:
    """The display form of a call's arguments, positional then keyword (`OpCall.attrs`)."""
    if kwargs:
        return tuple([_attr(x) for x in args] + [_attr(x) for x in kwargs.values()])
    return tuple([_attr(x) for x in args])


def read_call(args, kwargs, value_cap: int = VALUE_CAP) -> tuple[list, tuple, dict]:
    """(the call's tensors as `tensors_in` lists them, `attrs(args, kwargs)`, `encode(args, kwargs)`) in one walk
    over the arguments; one of a kind the walk does not know sends the call through the three walks instead."""
    tensors: list = []
    try:
        shown, spec = _read(args, tensors, value_cap)
        if not kwargs:
            return tensors, tuple(shown), {"args": spec, "kwargs": {}}
        shown_kw, spec_kw = _read(kwargs.values(), tensors, value_cap)
    except _Unread:
        return tensors_in(args, kwargs), attrs(args, kwargs), encode(args, kwargs, value_cap)
    return tensors, tuple(shown + shown_kw), {"args": spec, "kwargs": dict(zip(kwargs, spec_kw))}


class _Unread(Exception):
    """An argument `_read` leaves to the three walks."""


_SELF = frozenset({int, bool, str, type(None)})  # shown and encoded as themselves
_NAMED: dict = {}  # dtype, device, layout or memory format -> (its display, its spec key, its spec name)
_NAMED_KINDS = frozenset({torch.dtype, torch.device, torch.layout, torch.memory_format})
_SPEC_KEYS = {torch.dtype: "dtype", torch.device: "device", torch.layout: "layout",
              torch.memory_format: "memory_format"}


def _read(values, tensors: list, cap: int) -> tuple[list, list]:
    """(attrs, specs) of `values`, appending their tensors to `tensors` (the spec's "t" counts them)."""
    shown, spec = [], []
    for value in values:
        kind = type(value)
        if kind in _SELF:
            shown.append(value)
            spec.append(value)
        elif kind is float:
            shown.append(value)
            spec.append(value if math.isfinite(value) else {"float": repr(value)})
        elif isinstance(value, torch.Tensor):
            shown.append("<tensor>")
            out = {"t": len(tensors)}
            tensors.append(value)
            if value.dtype in _INT_LIKE:
                found = _values(value, cap)
                if found is not None:
                    out["v"] = found
            spec.append(out)
        elif kind is list or kind is tuple:
            inner_shown, inner_spec = _read(value, tensors, cap)
            shown.append(inner_shown)
            spec.append(inner_spec)
        elif kind in _NAMED_KINDS:
            named = _NAMED.get(value)
            if named is None:
                named = _NAMED[value] = (str(value), _SPEC_KEYS[kind], _special(value)[_SPEC_KEYS[kind]])
            shown.append(named[0])
            spec.append({named[1]: named[2]})
        else:
            raise _Unread
    return shown, spec


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _attr(value):
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return "<tensor>"
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_attr(v) for v in value]
    return type(value).__name__


def tensor_count(spec: dict) -> int:
    """How many tensor references a spec holds (equals len(OpCall.inputs) when it is consistent)."""
    return sum(1 for _ in iter_tensors(spec))


def iter_tensors(spec):
    """Every `{"t": i}` reference in a spec, in order."""
    if isinstance(spec, dict):
        if "t" in spec:
            yield spec
            return
        for value in spec.values():
            yield from iter_tensors(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from iter_tensors(value)


def unsupported(spec) -> list[str]:
    """Names of the argument types a spec could not encode (empty when it is replayable)."""
    if isinstance(spec, dict):
        if "unsupported" in spec:
            return [spec["unsupported"]]
        return [u for value in spec.values() for u in unsupported(value)]
    if isinstance(spec, list):
        return [u for value in spec for u in unsupported(value)]
    return []


def _encode(value, counter: list[int], cap: int):
    if isinstance(value, torch.Tensor):
        return _tensor(value, counter, cap)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, counter, cap) for v in value]
    return _special(value)


def _tensor(t: torch.Tensor, counter: list[int], cap: int) -> dict:
    out = {"t": counter[0]}
    counter[0] += 1
    values = _values(t, cap)
    if values is not None:
        out["v"] = values
    return out


def _values(t: torch.Tensor, cap: int):
    if t.dtype not in _INT_LIKE or t.numel() > cap or t.device.type == "meta":
        return None
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        return None  # fake tensors and other subclasses: no values to read
    try:
        with _real_data():  # a real constant under a fake mode (cnn.py's targets under --fake) keeps its values
            return t.detach().tolist()  # ints or bools, nested as the shape (the dtypes above)
    except Exception:  # noqa: BLE001 - a tensor that cannot give its data: builders make values
        return None


def _real_data():
    """Outside any FakeTensorMode for as long as a real tensor's data is read (a no-op without one)."""
    import contextlib

    if not _fake_mode_active():
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _fake_mode_active() -> bool:
    """True while a FakeTensorMode is on the dispatch stack: reading data would make unbacked symbols."""
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    return key is not None and torch._C._get_dispatch_mode(key) is not None


def _special(value):
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Generator):
        return {"generator": str(value.device)}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _symbolic(value)
    return {"unsupported": type(value).__name__}


def _symbolic(value):
    try:
        hint = value.node.hint if value.node.has_hint() else None
    except Exception:  # noqa: BLE001 - no concrete value behind this symbol
        hint = None
    if hint is None:
        return {"unsupported": type(value).__name__}
    return _encode(hint, [0], 0)
