"""MPS-view stage: the calls MPS would dispatch, derived from the CPU trace.

Four rewrites, each traceable to its rule:
- lens groups ("replace"): a span of CPU calls becomes the one op MPS runs (`linear`, `max_pool2d`,
  `_fused_rms_norm`, `_scaled_dot_product_attention_math_for_mps`, `_lstm_mps`), and the backward
  calls run by the autograd nodes that span created become one MPS backward op per pass (`linear_backward`
  carries its own arguments: the forward's input and weight and the incoming gradient, as a lens call);
- device branches inside composite kernels that the dispatch mode sees as one call
  (`convolution` -> `_mps_convolution`, `convolution_backward` -> `mps_convolution_backward`);
- a composite without an MPS kernel of its own (expanded by the recorder) is replaced by the calls
  it really dispatched (the leaves of its expansion), each keeping the composite as `cpu_op`;
  a composite that dispatched nothing is a metadata-only view and stays as it is;
- `copy_` is CompositeExplicitAutogradNonFunctional, and copy_impl sends any MPS tensor to the MPS
  copy (`mps_copy_`), so it is marked with rule `mps-copy`;
- an index call with a bool/uint8 mask (`index.Tensor`, `_index_put_impl_`: `x[mask]`, its backward,
  `x[mask] = v`) expands the mask with `nonzero` inside its kernel (expandTensors), below the dispatch mode:
  an `aten::nonzero` call of that mask is added before it (rule `index-nonzero`), so the release's nonzero
  kernel — a CPU fallback inside it below macOS 13/14 in 2.0-2.8 — is judged.
Every other call is what MPS dispatches too. Pure data: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opscan.opkey import OpKey
from opscan.trace.records import Group, OpCall, TensorMeta, Trace

COPY = OpKey("aten", "copy_")
LINEAR_BACKWARD = OpKey("aten", "linear_backward")
BRANCHED_COMPOSITES = frozenset({OpKey("aten", "convolution"), OpKey("aten", "convolution_backward")})
SRC_COPY = "aten/src/ATen/native/Copy.cpp copy_impl: MPS tensors go to mps::mps_copy_ (public source) [src]"
SRC_CONV = "mps_facts.md §8: at::native::_convolution calls _mps_convolution(_transpose) for MPS input [bin]"
SRC_MASK = ("aten/src/ATen/native/TensorAdvancedIndexingUtils.h expandTensors (`index.nonzero()` for a kByte/kBool "
            "index); at::meta::structured_index_Tensor::meta and at::native::_index_put_impl_ call at::_ops::nonzero "
            "directly in the torch 2.0.0, 2.4.1, 2.8.0 and 2.14.1 macOS libtorch_cpu.dylib call graphs [bin]")
VIEW_RULES = {
    "mps-convolution": ("any convolution on MPS input (transposed or not)", SRC_CONV),
    "mps-copy": ("copy_ with an MPS source or destination", SRC_COPY),
    "earlier-path": ("the predicted-for release's own Python code of the function that issued the call ran other ops "
                     "(facts.yaml earlier_paths with `from`; applied per release by predict/python_paths.py)",
                     "opscan/knowledge/facts.yaml earlier_paths + py_drift.txt (the releases' wheels)"),
    "index-nonzero": ("an index call with a bool/uint8 mask: its kernel expands the mask with nonzero (TensorIndexing "
                      "expandTensors, called by index.Tensor's meta and _index_put_impl_), a dispatch below the trace",
                      SRC_MASK),
    "composite-callee": ("a CompositeExplicitAutograd(NonFunctional) op without an MPS kernel: the calls its "
                         "composite kernel dispatched, recorded by re-dispatching it inside the recorder",
                         "native_functions.yaml composite entries; opscan recorder expansion"),
    # added after the view, per predicted-for release, by opscan/predict/release_paths.py
    "release-callees": ("an op the predicted-for release's C++ composite kernel calls where the tracing torch's "
                        "calls another (or runs the composite as an op of its own there)",
                        "opscan/knowledge/composite_callees.txt (tools/build_composite_callees.py: each release's "
                        "macOS arm64 libtorch_cpu.dylib) [bin]"),
    "release-callees-unknown": ("a call of a composite whose kernel in the predicted-for release is not known: "
                                "the tracing torch's path, said so in the evidence",
                                "opscan/knowledge/composite_callees.txt [bin]"),
}
_VIEWS = frozenset({"t", "view", "_unsafe_view", "transpose", "expand", "reshape", "permute", "unsqueeze",
                    "squeeze", "detach", "contiguous", "clone", "alias", "as_strided", "select", "slice"})


@dataclass(frozen=True)
class MpsCall:
    """One call as MPS would dispatch it."""

    index: int  # index of the first CPU-trace call it stands for
    op: OpKey
    phase: str
    module: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    dtypes: tuple[str, ...]
    cpu_op: OpKey | None = None  # the op the CPU trace saw, when different
    rule: str | None = None  # the rewrite that produced it
    callees: tuple[tuple[OpKey, tuple[str, ...]], ...] | None = None  # composite: what it runs
    attrs: tuple = ()
    call: tuple | None = None  # a lens group's high-level call: its tensors' metadata and argspec (Group.call)
    registration: object = None  # trace.registrations.Registration: a custom op the target registered itself


def mps_view(trace: Trace) -> tuple[MpsCall, ...]:
    """The trace's device-work calls as MPS would dispatch them, in order."""
    spans = {i: g for g in trace.groups if g.mode == "replace" for i in range(g.start, g.end)}
    by_node = {n: g for g in trace.groups if g.mode == "replace" and g.backward for n in g.nodes}
    leaves = _leaf_calls(trace.calls)
    passes = _backward_passes(trace.calls)
    out: list[MpsCall] = []
    emitted: set[tuple[int, str, int]] = set()
    findable = trace.findable()
    backward = _backward_by_node(findable)
    for call in findable:
        group = spans.get(call.index)
        if group is not None:
            if call.index == _first_top(trace, group):
                out.append(_forward_group(trace, group))
            continue
        group = by_node.get(call.node) if call.phase == "backward" else None
        if group is not None:
            key = (group.start, group.rule, passes[call.index])
            if key not in emitted:
                emitted.add(key)
                out.append(_backward_group(group, call, backward))
            continue
        if leaves.get(call.index):
            out.extend(_callee(leaf, call) for leaf in leaves[call.index])
        else:
            out.append(_plain(call, () if call.expanded else None))
    out = _mask_nonzero(out, trace)
    registered = dict(trace.registrations)  # custom ops the target registered itself (trace/registrations.py)
    return tuple(replace(c, registration=registered[c.op]) if c.op in registered else c for c in out)


def _first_top(trace: Trace, group: Group) -> int:
    for i in range(group.start, group.end):
        c = trace.calls[i]
        if c.parent is None and not c.bookkeeping:
            return i
    return group.start


def _primary(calls: list[OpCall]) -> OpKey | None:
    for call in calls:
        if call.op.name not in _VIEWS:
            return call.op
    return calls[0].op if calls else None


def _forward_group(trace: Trace, group: Group) -> MpsCall:
    calls = [c for c in trace.calls[group.start:group.end] if c.parent is None and not c.bookkeeping]
    first = calls[0]
    return MpsCall(
        index=first.index, op=group.forward, phase=first.phase, module=group.module or first.module,
        inputs=first.inputs + _host_inputs(calls, first.inputs), outputs=calls[-1].outputs, dtypes=group.dtypes,
        cpu_op=_primary(calls), rule=group.rule, call=group.call,
    )


def _host_inputs(calls, given) -> tuple[TensorMeta, ...]:
    """The host tensors the span's calls read that no call of it made (and `given` lacks): the group's op reads
    them too, so the placement model sees them (a CPU weight of F.linear reaches _mps_linear)."""
    made = {t.storage for c in calls for t in c.outputs}
    seen = {t.storage for t in given}
    out = []
    for c in calls:
        for t in c.inputs:
            if t.host and t.storage not in made and t.storage not in seen:
                seen.add(t.storage)
                out.append(t)
    return tuple(out)


def _backward_by_node(findable) -> dict[int, list[OpCall]]:
    """Backward calls by the autograd node that ran them (one pass over the trace, not one per group)."""
    out: dict[int, list[OpCall]] = {}
    for c in findable:
        if c.phase == "backward":
            out.setdefault(c.node, []).append(c)
    return out


def _backward_group(group: Group, first: OpCall, backward: dict[int, list[OpCall]]) -> MpsCall:
    calls = sorted((c for n in group.nodes for c in backward.get(n, ())), key=lambda c: c.index)
    return MpsCall(
        index=first.index, op=group.backward, phase="backward", module=group.module or first.module,
        inputs=first.inputs, outputs=calls[-1].outputs, dtypes=group.dtypes, cpu_op=_primary(calls),
        rule=group.rule, call=_linear_backward_call(group, [c for c in calls if c.index >= first.index]),
    )


def _linear_backward_call(group: Group, calls: list[OpCall]) -> tuple | None:
    """linear_backward's own tensors (self, grad_output, weight) as a lens call, so that conditions read them by
    name: the forward call's input and weight, and the incoming gradient — the first tensor this pass's backward
    calls read that has the forward output's shape (its strides as autograd hands it over: the gradient of a
    `.sum()` is an expanded, stride-0 tensor). None for other groups, or when no such tensor was recorded."""
    if group.backward != LINEAR_BACKWARD or group.call is None or len(group.call[0]) < 2:
        return None
    x, w = group.call[0][:2]
    out_shape = tuple(x[1][:-1]) + ((w[1][0],) if len(w[1]) == 2 else ())
    grad = next((m for c in calls for m in c.inputs if tuple(m.shape) == out_shape), None)
    if grad is None:
        return None
    g = (grad.dtype, tuple(grad.shape), tuple(grad.stride), grad.offset, grad.requires_grad)
    return (x, g, w), {"args": [{"t": 0}, {"t": 1}, {"t": 2}], "kwargs": {}}


def _backward_passes(calls) -> list[int]:
    """For each call, how many backward passes had started by then."""
    passes, previous, out = 0, "", []
    for c in calls:
        if c.phase == "backward" and previous != "backward":
            passes += 1
        previous = c.phase
        out.append(passes)
    return out


def _plain(call: OpCall, callees) -> MpsCall:
    branch = _conv_branch(call)
    rule = "mps-convolution" if branch else ("mps-copy" if call.op == COPY else None)
    return MpsCall(
        index=call.index, op=branch or call.op, phase=call.phase, module=call.module, inputs=call.inputs,
        outputs=call.outputs, dtypes=call.dtypes, cpu_op=call.op if branch else None,
        rule=rule, callees=None if branch else callees, attrs=call.attrs,
    )


def _callee(leaf: OpCall, composite: OpCall) -> MpsCall:
    plain = _plain(leaf, () if leaf.expanded else None)
    return MpsCall(
        index=leaf.index, op=plain.op, phase=composite.phase, module=composite.module, inputs=leaf.inputs,
        outputs=leaf.outputs, dtypes=leaf.dtypes, cpu_op=composite.op, rule=plain.rule or "composite-callee",
        callees=plain.callees, attrs=leaf.attrs,
    )


def _conv_branch(call: OpCall) -> OpKey | None:
    if call.op.namespace != "aten" or call.op.overload != "default":
        return None
    if call.op.name == "convolution" and len(call.attrs) > 6:
        return OpKey("aten", "_mps_convolution_transpose" if call.attrs[6] else "_mps_convolution")
    if call.op.name == "convolution_backward" and len(call.attrs) > 7:
        transposed = call.attrs[7]
        return OpKey("aten", "mps_convolution_transpose_backward" if transposed else "mps_convolution_backward")
    return None


def _leaf_calls(calls) -> dict[int, list[OpCall]]:
    """For each expanded composite: the calls that really dispatched under it (nested composites
    replaced by their own leaves; views that dispatched nothing kept)."""
    children: dict[int, list[OpCall]] = {}
    for call in calls:
        if call.parent is not None:
            children.setdefault(call.parent, []).append(call)

    def leaves(index: int):
        for child in children.get(index, ()):
            if child.index in children:
                yield from leaves(child.index)
            else:
                yield child

    return {index: list(leaves(index)) for index in children}


NONZERO = OpKey("aten", "nonzero")
MASK_INDEX_OPS = frozenset(OpKey.from_yaml(o) for o in (
    "index.Tensor", "index.Tensor_out", "_index_put_impl_", "_index_put_impl", "_index_put_impl.out"))
MASK_DTYPES = frozenset({"bool", "uint8"})


def _mask_nonzero(view: list[MpsCall], trace: Trace) -> list[MpsCall]:
    """The view with an `aten::nonzero` call (rule `index-nonzero`) before each index call, per bool/uint8 index."""
    if not any(c.op in MASK_INDEX_OPS for c in view):
        return view
    fresh = 1 + max((t.storage for c in trace.calls for t in (*c.inputs, *c.outputs)), default=0)
    out: list[MpsCall] = []
    for call in view:
        for mask, rows in _masks(call):
            dims = len(mask.shape)
            result = TensorMeta("int64", (rows, dims), (dims, 1), mask.device, fresh, rows * dims * 8)
            fresh += 1
            out.append(MpsCall(index=call.index, op=NONZERO, phase=call.phase, module=call.module, inputs=(mask,),
                               outputs=(result,), dtypes=(mask.dtype,), cpu_op=call.op, rule="index-nonzero",
                               attrs=("<tensor>",)))
        out.append(call)
    return out


def _masks(call: MpsCall) -> list[tuple[TensorMeta, int]]:
    """(mask, its nonzero count) of each bool/uint8 index of an index call: the count read from the result (or the
    values put) where the mask is the only index, else the mask's element count (an upper bound)."""
    if call.op not in MASK_INDEX_OPS or len(call.attrs) < 2 or not isinstance(call.attrs[1], list):
        return []
    indices = call.attrs[1]
    tensors = iter(call.inputs[1:])
    metas = [next(tensors, None) if i == "<tensor>" else None for i in indices]
    masks = [(pos, m) for pos, m in enumerate(metas) if m is not None and m.dtype in MASK_DTYPES]
    sole = len([m for m in metas if m is not None]) == 1
    carrier = call.outputs[0] if call.op.name == "index" and call.outputs else next(tensors, None)
    found = []
    for pos, mask in masks:
        rows = _product(mask.shape)
        if sole and carrier is not None and len(carrier.shape) > pos:
            rows = carrier.shape[pos]
        found.append((mask, rows if rows >= 0 else _product(mask.shape)))
    return found


def _product(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
