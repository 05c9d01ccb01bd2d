"""Probe stage: the inputs of a probe call that a forward made — saved statistics, indices, workspaces.

A backward call such as `native_batch_norm_backward` consumes tensors its forward saved (`save_mean`,
`save_invstd`). Replaying them as the trace recorded them hands the device what the *CPU's* forward saved, which
another device's forward may never make: CUDA keeps float16/bfloat16 batch-norm and layer-norm statistics in
float32 and its backward refuses half ones ("Expected save_mean to have type Float but got Half"); the CPU keeps
them in the input's dtype and refuses float32 ones. So for a call in SAVED, the forward that made those inputs is
found in the trace by tensor identity (the same storage, shape and stride; the latest call of one of the forward
ops listed before the call) and attached to the probe as its `Feed` (protocol.py): the worker runs that forward
on the probe's device first and hands its outputs to the call (rebuild.py's Fed), and the CPU reference does the
same on the CPU. Tensors the forward and the call share (the forward's `input` is the backward's `input`) are
one tensor in both runs.

Where the forward cannot be replayed (not in the trace, an argument that cannot cross a process), a per-device
rule with its source says which dtype that device's forward saves (DEVICE_RULES); without one the recorded
tensors stay, as before. Parent side: imports torch (schemas), never runs an op.
"""

from __future__ import annotations

from dataclasses import replace

from opscan.probe.protocol import Feed, ProbeCall, TensorSpec, new_call, probe_id

_BATCH_NORMS = frozenset({"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                          "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
                          "_batch_norm_with_update_functional", "_batch_norm_no_update", "cudnn_batch_norm",
                          "miopen_batch_norm"})
_FLASH_CUDA = frozenset({"_scaled_dot_product_flash_attention"})

# consumer op name -> (its arguments that a forward made, the forward ops that make them), from the ops' schemas
# in native_functions.yaml (derivatives.yaml: what each forward saves for its backward)
SAVED = {
    "native_batch_norm_backward": (("save_mean", "save_invstd"), _BATCH_NORMS),
    "batch_norm_backward": (("save_mean", "save_var", "reserve"), _BATCH_NORMS),
    "cudnn_batch_norm_backward": (("save_mean", "save_var", "reserveSpace"), frozenset({"cudnn_batch_norm"})),
    "miopen_batch_norm_backward": (("save_mean", "save_var"), frozenset({"miopen_batch_norm"})),
    "native_layer_norm_backward": (("mean", "rstd"), frozenset({"native_layer_norm"})),
    "native_group_norm_backward": (("mean", "rstd"), frozenset({"native_group_norm"})),
    "_fused_rms_norm_backward": (("rstd",), frozenset({"_fused_rms_norm"})),
    "max_pool2d_with_indices_backward": (("indices",), frozenset({"max_pool2d_with_indices"})),
    "max_pool3d_with_indices_backward": (("indices",), frozenset({"max_pool3d_with_indices"})),
    "adaptive_max_pool2d_backward": (("indices",), frozenset({"adaptive_max_pool2d"})),
    "adaptive_max_pool3d_backward": (("indices",), frozenset({"adaptive_max_pool3d"})),
    "fractional_max_pool2d_backward": (("indices",), frozenset({"fractional_max_pool2d"})),
    "fractional_max_pool3d_backward": (("indices",), frozenset({"fractional_max_pool3d"})),
    "nll_loss_backward": (("total_weight",), frozenset({"nll_loss_forward"})),
    "nll_loss2d_backward": (("total_weight",), frozenset({"nll_loss2d_forward"})),
    "_scaled_dot_product_flash_attention_for_cpu_backward": (
        ("out", "logsumexp"), frozenset({"_scaled_dot_product_flash_attention_for_cpu"})),
    "_scaled_dot_product_flash_attention_backward": (
        ("out", "logsumexp", "cum_seq_q", "cum_seq_k", "philox_seed", "philox_offset"), _FLASH_CUDA),
    "_scaled_dot_product_efficient_attention_backward": (
        ("out", "logsumexp", "philox_seed", "philox_offset"), frozenset({"_scaled_dot_product_efficient_attention"})),
    "_scaled_dot_product_cudnn_attention_backward": (
        ("out", "logsumexp", "philox_seed", "philox_offset", "cum_seq_q", "cum_seq_k"),
        frozenset({"_scaled_dot_product_cudnn_attention"})),
    "_embedding_bag_backward": (("offset2bag", "bag_size", "maximum_indices"),
                                frozenset({"_embedding_bag", "_embedding_bag_forward_only"})),
    "_embedding_bag_dense_backward": (("offset2bag", "bag_size", "maximum_indices"),
                                      frozenset({"_embedding_bag", "_embedding_bag_forward_only"})),
    "_embedding_bag_per_sample_weights_backward": (("offset2bag",),
                                                   frozenset({"_embedding_bag", "_embedding_bag_forward_only"})),
    "_thnn_fused_lstm_cell_backward_impl": (("cy", "workspace"), frozenset({"_thnn_fused_lstm_cell"})),
    "_thnn_fused_gru_cell_backward": (("workspace",), frozenset({"_thnn_fused_gru_cell"})),
    "_weight_norm_interface_backward": (("saved_norms",), frozenset({"_weight_norm_interface"})),
    "_ctc_loss_backward": (("neg_log_likelihood", "log_alpha"), frozenset({"_ctc_loss"})),
}
FORWARDS = frozenset().union(*(ops for _, ops in SAVED.values()))

_NORMS_CUDA = "float32 (at::toAccumulateType(input, /*is_cuda=*/true)) for a float16 or bfloat16 input"
# (device, consumer op name) -> (its saved arguments whose dtype the rule sets, the dtype rule, its source). Used
# only where the forward cannot be replayed; a device or op not listed keeps the recorded dtypes (the CPU and MPS
# keep batch-norm statistics in the input's dtype: aten/src/ATen/native/mps/operations/Normalization.mm,
# batch_norm_mps allocates save_mean/save_var with self.scalar_type()).
DEVICE_RULES = {
    ("cuda", "native_batch_norm_backward"): (
        ("save_mean", "save_invstd"), _NORMS_CUDA,
        "aten/src/ATen/native/cuda/Normalization.cu (batch_norm_cuda: save_mean and save_invstd in the "
        "accumulate type)"),
    ("cuda", "batch_norm_backward"): (
        ("save_mean", "save_var"), _NORMS_CUDA,
        "aten/src/ATen/native/cuda/Normalization.cu (_batch_norm_with_update_cuda via batch_norm_cuda)"),
    ("cuda", "native_layer_norm_backward"): (
        ("mean", "rstd"), _NORMS_CUDA,
        "aten/src/ATen/native/cuda/layer_norm_kernel.cu (layer_norm_cuda: mean and rstd in the accumulate type)"),
}
_HALF = frozenset({"float16", "bfloat16"})


class Producers:
    """The trace's calls of FORWARDS by the tensors they made: (storage, shape, stride) -> [(call index, output
    position)], in trace order. Built once per plan, in one pass over the calls."""

    def __init__(self, trace):
        self.trace = trace
        self.made: dict[tuple, list[tuple[int, int]]] = {}
        for call in trace.calls:
            if call.op.name in FORWARDS and call.raised is None:
                for position, meta in enumerate(call.outputs):
                    if meta.storage >= 0:
                        self.made.setdefault(_key(meta), []).append((call.index, position))

    def latest(self, meta, before: int, ops) -> tuple[int, int] | None:
        """(call index, output position) of the latest call of `ops` before `before` that made `meta`."""
        found = None
        for index, position in self.made.get(_key(meta), ()):
            if index >= before:
                break
            if self.trace.calls[index].op.name in ops:
                found = (index, position)
        return found


def _key(meta) -> tuple:
    return meta.storage, meta.shape, meta.stride


def with_feed(probe: ProbeCall, call, producers: Producers, device: str, from_call) -> tuple[ProbeCall, str | None]:
    """(`probe` (made from the recorded `call`) with the forward that made its saved inputs attached, or with a
    device rule applied where that forward cannot be replayed; how its saved inputs are made, None when it
    consumes no forward's outputs). `from_call` makes a ProbeCall (or a reason) from a recorded call (calls.py)."""
    saved = SAVED.get(call.op.name)
    if saved is None:
        return probe, None
    names, ops = saved
    indices = _indices(probe, names)
    found = {i: producers.latest(call.inputs[i], call.index, ops) for i in indices}
    found = {i: where for i, where in found.items() if where is not None}
    forward_index = next(iter(found.values()), (None, None))[0]
    forward = producers.trace.calls[forward_index] if forward_index is not None else None
    made = from_call(forward) if forward is not None else "no forward call made them in the trace"
    if isinstance(made, str):
        return _by_rule(probe, call, device, names, made)
    outputs = tuple((i, position) for i, (index, position) in found.items() if index == forward_index)
    fed = {i for i, _ in outputs}
    shared = tuple((j, k) for j, meta in enumerate(forward.inputs)
                   if (k := _same(meta, call.inputs, fed)) is not None)
    spec = Feed(made.op, made.tensors, made.spec, shared, outputs, 0).signature()
    feed = Feed(made.op, made.tensors, made.spec, shared, outputs, int(probe_id(spec)[:8], 16))
    tensors = tuple(replace(t, values=None) if i in fed else t for i, t in enumerate(probe.tensors))
    spec = _without_values(probe.spec, fed)
    return new_call(probe.op, tensors, spec, feed), f"by its forward {made.op}, run on the probe's device first"


def _indices(probe: ProbeCall, names) -> list[int]:
    """The tensor indices of the call's arguments called `names` (by the op's schema)."""
    from opscan.probe.replay import named_args, resolve
    from opscan.probe.rebuild import BuildError

    try:
        named = named_args(resolve(probe.op), probe.spec)
    except BuildError:
        return []
    return [named[n]["t"] for n in names if isinstance(named.get(n), dict) and "t" in named[n]]


def _same(meta, inputs, fed) -> int | None:
    """The call's input that is the same tensor as `meta` (not one the forward makes), or None."""
    return next((k for k, m in enumerate(inputs) if k not in fed and m.storage >= 0 and _key(m) == _key(meta)),
                None)


def _without_values(spec, fed):
    """The spec with no recorded values for the fed tensors (the forward makes them in each run)."""
    if isinstance(spec, dict):
        if "t" in spec:
            return {"t": spec["t"]} if spec["t"] in fed else spec
        return {k: _without_values(v, fed) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_without_values(v, fed) for v in spec]
    return spec


def _by_rule(probe: ProbeCall, call, device: str, names, why: str) -> tuple[ProbeCall, str]:
    """The probe with DEVICE_RULES' dtype for its saved inputs on `device` (unchanged without a rule), and how
    they are made."""
    rule = DEVICE_RULES.get((device, call.op.name))
    recorded = f"as recorded (the forward cannot be replayed: {why})"
    if rule is None:
        return probe, recorded
    ruled, dtype_rule, source = rule
    indices = set(_indices(probe, [n for n in names if n in ruled]))
    if not any(probe.tensors[i].dtype in _HALF for i in indices):
        return probe, recorded
    tensors = tuple(TensorSpec("float32", t.shape, t.stride, t.values) if i in indices and t.dtype in _HALF else t
                    for i, t in enumerate(probe.tensors))
    return new_call(probe.op, tensors, probe.spec), f"by the {device} rule: {dtype_rule}, {source} ({why})"
