"""Predict stage: a call's arguments by name — the one binder of every condition the knowledge files hold
(kernel_rules.yaml rules and fallbacks, silent_bugs.yaml, composite_paths.yaml paths).

The names are those of the schema of the op whose arguments the trace recorded, in the release that recorded
them (knowledge/signatures.txt's column for the installed torch: `recording(kb)`): the call's own op, or, where
the MPS view runs another op in its place, the recorded one (knowledge/signatures.py RECORDED_AS: MPS
convolutions read convolution's arguments, the lens's ops the high-level call's). Values bind in the schema's
order; a lens group's high-level call binds its positional arguments in order and its keyword arguments by
name. An argument the call left out is the schema's default where that is a literal (None, a bool, a number, a
list, a string, a reduction), else unbound (a condition reading it is undecided). Tensors are
conditions.TensorArg (dtype, shape, strides, storage offset, device, requires_grad, as recorded); `self` also
names a recorded `input` (an MPS op's schema calls it `self`); `result` is the tensor the op writes (its `out=`
tensor, `self` of an in-place op, else its first output). Pure: no torch.
"""

from __future__ import annotations

from opscan.knowledge.conditions import TensorArg
from opscan.knowledge.signatures import NO_DEFAULT, RECORDED_AS, RESULT, load_signatures



def recorded_op(call) -> str:
    """The yaml name of the op whose schema names the call's recorded arguments."""
    rewritten = call.call is not None or call.rule == "mps-convolution"
    name = call.op.yaml_name
    return RECORDED_AS.get(name, name) if rewritten else name


def arguments(call, release: str) -> dict | None:
    """The call's arguments by their schema names in `release`, the torch that recorded them (module docstring);
    None when its recorded op's schema is not known (not an aten op, or one the table lacks)."""
    table = load_signatures()
    schema = table.arguments(recorded_op(call), release) if table and call.op.namespace == "aten" else None
    if schema is None:
        return None
    names = [a.name for a in schema]
    if call.call is not None:  # a lens group: the high-level call's own arguments
        metas, spec = call.call
        tensors = [_from_meta(m) for m in metas]
        bound = dict(zip(names, (_from_spec(v, tensors) for v in spec.get("args", ()))))
        bound.update({k: _from_spec(v, tensors) for k, v in spec.get("kwargs", {}).items()})
    else:
        inputs = iter([tensor_arg(t) for t in call.inputs])
        bound = dict(zip(names, [_from_attr(a, inputs) for a in call.attrs]))
    for argument in schema:
        if argument.name not in bound and (default := argument.value()) is not NO_DEFAULT:
            bound[argument.name] = default
    if "input" in bound and "self" not in bound:
        bound["self"] = bound["input"]
    bound[RESULT] = _result(call, bound)
    return bound


def recording(kb) -> str:
    """The release whose schemas name a trace's recorded arguments: the installed torch (kb.release without one)."""
    return kb.installed_release or kb.release


def first_tensor(bound: dict | None) -> TensorArg | None:
    """The call's first tensor argument (a message pattern's rule reads it as `self`)."""
    return next((v for k, v in (bound or {}).items() if k != RESULT and isinstance(v, TensorArg)), None)


def tensor_arg(meta) -> TensorArg:
    """A recorded TensorMeta as the conditions see it."""
    return TensorArg(meta.dtype, tuple(meta.shape), tuple(meta.stride), meta.offset,
                     "cpu" if meta.host else "mps", meta.requires_grad)


def _from_meta(m) -> TensorArg:
    """A lens group's tensor: (dtype, shape, stride, storage offset, requires_grad)."""
    return TensorArg(m[0], tuple(m[1]), tuple(m[2]), m[3] if len(m) > 3 and m[3] >= 0 else None, None,
                     m[4] if len(m) > 4 else None)


def _result(call, bound: dict):
    if isinstance(bound.get("out"), TensorArg):
        return bound["out"]
    if call.op.name.endswith("_") and isinstance(bound.get("self"), TensorArg):
        return bound["self"]
    return tensor_arg(call.outputs[0]) if call.outputs else None


def _from_spec(value, tensors: list):
    """One argspec value -> a TensorArg, a list, or a plain value."""
    if isinstance(value, dict):
        if "t" in value:
            return tensors[value["t"]] if value["t"] < len(tensors) else None
        return next(iter(value.values()), None)  # {"dtype": "float32"}, {"float": "inf"}, ...
    if isinstance(value, list):
        return [_from_spec(v, tensors) for v in value]
    return value


def _from_attr(value, tensors):
    """One recorded attr -> a TensorArg (consuming the next input), a list, or the value."""
    if value == "<tensor>":
        return next(tensors, None)
    if isinstance(value, list):
        return [_from_attr(v, tensors) for v in value]
    return value
