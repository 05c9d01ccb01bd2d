"""Probe stage: replays for MPS-view ops that the CPU trace never dispatched (the lens's "replace" rows).

On MPS `F.linear` runs aten::linear (and aten::linear_backward), `F.max_pool2d` runs aten::max_pool2d
(and max_pool2d_backward), where the CPU trace shows t+addmm and max_pool2d_with_indices. To measure
those rows on MPS the probe must call the op MPS runs; its arguments are rebuilt here from the span of
CPU calls the lens marked, or, for ops only MPS has (`_fused_rms_norm`, attention's
`_scaled_dot_product_attention_math_for_mps`, `_lstm_mps`), from the high-level call itself (Group.call).
Rows without a replay here stay `unknown` on MPS, with the reason (lstm_mps_backward: its inputs are
_lstm_mps's own saved outputs).
On cpu and cuda the span's own calls are probed instead (that is what those devices run).
"""

from __future__ import annotations

from opscan.probe.protocol import TensorSpec
from opscan.trace.argspec import iter_tensors
from opscan.trace.records import Group, OpCall, TensorMeta

_RESHAPES = frozenset({"view", "_unsafe_view", "reshape"})


def replay_for(group: Group, calls: list[OpCall], backward: list[OpCall], is_backward: bool):
    """(op display, tensors, spec) for the MPS op of this group, or a string saying why there is none.

    `calls` are the top-level CPU calls of the forward span; `backward` those of this backward pass."""
    op = group.backward if is_backward else group.forward
    signature = _FROM_CALL.get(op.display if op else "")
    if signature is not None and group.call is not None:
        return _from_call(op.display, group.call, *signature)
    builder = _BUILDERS.get(op.display if op else "")
    if builder is None:
        return f"no probe replay for {op.display if op else group.rule} (lens rule {group.rule}) on MPS yet"
    try:
        return builder(calls, backward)
    except (StopIteration, IndexError, KeyError):
        return f"the CPU calls of lens rule {group.rule} do not have the expected form: {op.display} not rebuilt"


def _spec(meta: TensorMeta) -> TensorSpec:
    return TensorSpec(meta.dtype, meta.shape, meta.stride, None, max(meta.offset, 0))


def _contiguous(dtype: str, shape) -> TensorSpec:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return TensorSpec(dtype, tuple(shape), tuple(reversed(stride)))


def _linear_parts(calls: list[OpCall]):
    """(x, weight, bias or None) metadata from view? + t + addmm|mm (+ view)."""
    weight = next(c for c in calls if c.op.name == "t").inputs[0]
    mm = next(c for c in calls if c.op.name in ("addmm", "mm"))
    bias = mm.inputs[0] if mm.op.name == "addmm" else None
    x = calls[0].inputs[0] if calls[0].op.name in _RESHAPES else mm.inputs[-2]
    return x, weight, bias


def _linear(calls, backward):
    x, weight, bias = _linear_parts(calls)
    tensors = [_spec(x), _spec(weight)] + ([_spec(bias)] if bias is not None else [])
    args = [{"t": 0}, {"t": 1}, {"t": 2} if bias is not None else None]
    return "aten::linear", tensors, {"args": args, "kwargs": {}}


def _linear_backward(calls, backward):
    x, weight, bias = _linear_parts(calls)
    grad = _contiguous(x.dtype, (*x.shape[:-1], weight.shape[0]))
    tensors = [_contiguous(x.dtype, x.shape), grad, _spec(weight)]
    mask = [True, True, bias is not None]
    return "aten::linear_backward", tensors, {"args": [{"t": 0}, {"t": 1}, {"t": 2}, mask], "kwargs": {}}


def _max_pool2d(calls, backward):
    call = next(c for c in calls if c.op.name == "max_pool2d_with_indices")
    return "aten::max_pool2d", [_spec(call.inputs[0])], call.args_spec


def _max_pool2d_backward(calls, backward):
    call = next(c for c in backward if c.op.name == "max_pool2d_with_indices_backward")
    args = list(call.args_spec["args"])[:7]  # grad_output, self, kernel, stride, padding, dilation, ceil_mode
    return "aten::max_pool2d_backward", [_spec(m) for m in call.inputs[:2]], {"args": args, "kwargs": {}}


_BUILDERS = {
    "aten::linear": _linear,
    "aten::linear_backward": _linear_backward,
    "aten::max_pool2d": _max_pool2d,
    "aten::max_pool2d_backward": _max_pool2d_backward,
}


# MPS-only ops whose arguments are the high-level call's (Group.call), rearranged: the Python function's
# parameter names, then the op's positional and keyword parameters by those names (None: pass None)
_FROM_CALL = {
    "aten::_fused_rms_norm": (("input", "normalized_shape", "weight", "eps"),
                              ("input", "normalized_shape", "weight", "eps"), ()),
    "aten::_scaled_dot_product_attention_math_for_mps": (
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", None), ("scale", "enable_gqa")),
    "aten::_lstm_mps": (
        ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train", "bidirectional", "batch_first"),
        ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train", "bidirectional", "batch_first"),
        ()),
}
_DEFAULTS = {"weight": None, "eps": None, "attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
             "enable_gqa": False}


def _from_call(op: str, call, names, positional, keywords):
    """(op, tensors, spec) of an MPS-only op from the high-level call the lens recorded (F.rms_norm,
    F.scaled_dot_product_attention, torch.lstm), its arguments bound by name."""
    metas, spec = call
    bound = dict(_DEFAULTS)
    bound.update(zip(names, spec["args"]))
    bound.update(spec["kwargs"])
    missing = [n for n in (*positional, *keywords) if n is not None and n not in bound]
    if missing:
        return f"{op}: the recorded call lacks {', '.join(missing)}; not rebuilt"
    values = {ref["t"]: ref.get("v") for ref in iter_tensors(spec)}
    tensors = [TensorSpec(dtype, tuple(shape), tuple(stride), values.get(i), max(rest[0], 0) if rest else 0)
               for i, (dtype, shape, stride, *rest) in enumerate(metas)]
    args = [None if n is None else _strip(bound[n]) for n in positional]
    return op, tensors, {"args": args, "kwargs": {n: _strip(bound[n]) for n in keywords}}


def _strip(value):
    """An argument without recorded tensor values (they travel in the TensorSpecs)."""
    if isinstance(value, dict):
        return {"t": value["t"]} if "t" in value else {k: _strip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value
