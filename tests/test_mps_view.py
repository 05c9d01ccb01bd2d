"""MPS view: the calls MPS dispatches, as opposed to what a CPU trace sees.

One crafted model holds every rewrite the view knows (conv, max_pool2d, LSTM, RMSNorm, linear,
attention); its exact MPS-view op sequences are pinned in training and in inference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opscan.knowledge import load_knowledge
from opscan.mps_view import mps_view
from opscan.opkey import OpKey
from opscan.scan import ScanOptions, run_trace
from opscan.target.load import Target


class Zoo(nn.Module):
    """conv -> max_pool2d, LSTM -> RMSNorm -> linear -> attention."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.norm = nn.RMSNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, img, seq):
        a = self.pool(self.conv(img)).flatten(1)[:, :8]
        h, _ = self.lstm(seq)
        q = self.proj(self.norm(h)).unsqueeze(1)
        att = F.scaled_dot_product_attention(q, q, q).squeeze(1)
        return att.sum(1).sum(1) + a.sum(1)


def _view(inference: bool):
    torch.manual_seed(0)
    target = Target("zoo", "Zoo", Zoo(), (torch.randn(2, 1, 4, 4), torch.randn(2, 3, 8)), None, None, None)
    trace = run_trace(target, ScanOptions("zoo", inference=inference), load_knowledge())
    return trace, mps_view(trace)


def _ops(view, phase):
    return [c.op.display.removeprefix("aten::") for c in view if c.phase == phase]


@pytest.fixture(scope="module")
def train():
    return _view(inference=False)


@pytest.fixture(scope="module")
def infer():
    return _view(inference=True)


ZEROS = ["empty.memory_format", "zero_"]  # torch.zeros for the LSTM's h0 and c0 (composite)
# attention with grad: MPS takes the math path (scale q and k, bmm, safe softmax, bmm)
SDPA_MATH_FORWARD = [
    "mul.Tensor", "transpose.int", "mul.Tensor", "expand", "view", "expand", "view", "bmm", "_unsafe_view",
    "_softmax", "isneginf", "all.dim", "empty.memory_format", "fill_.Scalar", "where.self_out", "detach",
    "expand", "view", "expand", "view", "bmm", "_unsafe_view",
]
# RMSNorm with grad: MPS runs rms_norm_composite, the decomposition the CPU trace shows too
RMS_COMPOSITE_FORWARD = ["pow.Tensor_Scalar", "mean.dim", "add_.Tensor", "rsqrt", "detach", "mul.Tensor",
                         "mul.Tensor"]


def test_training_forward_is_what_mps_dispatches(train):
    _, view = train
    assert _ops(view, "forward") == [
        "_mps_convolution", "max_pool2d", "view", "slice.Tensor", *ZEROS, *ZEROS, "_lstm_mps",
        *RMS_COMPOSITE_FORWARD, "empty.memory_format", "copy_", "linear", "unsqueeze", *SDPA_MATH_FORWARD,
        "squeeze.dim", "sum.dim_IntList", "sum.dim_IntList", "sum.dim_IntList", "add.Tensor",
    ]


def test_training_backward_uses_mps_backward_kernels(train):
    _, view = train
    backward = _ops(view, "backward")
    for op in ("linear_backward", "lstm_mps_backward", "max_pool2d_backward", "mps_convolution_backward"):
        assert backward.count(op) == 1, op  # one MPS backward op per module, not its CPU decomposition
    assert backward.index("linear_backward") < backward.index("lstm_mps_backward") < \
        backward.index("max_pool2d_backward") < backward.index("mps_convolution_backward")
    for cpu_only in ("mm", "addmm", "convolution_backward", "max_pool2d_with_indices_backward"):
        assert cpu_only not in backward


def test_inference_forward_uses_fused_kernels(infer):
    _, view = infer
    assert _ops(view, "forward") == [
        "_mps_convolution", "max_pool2d", "view", "slice.Tensor", *ZEROS, *ZEROS, "_lstm_mps",
        "_fused_rms_norm", "linear", "unsqueeze", "_scaled_dot_product_attention_math_for_mps",
        "squeeze.dim", "sum.dim_IntList", "sum.dim_IntList", "sum.dim_IntList", "add.Tensor",
    ]
    assert _ops(view, "backward") == []


def test_rewritten_calls_keep_the_cpu_op_and_rule(infer):
    _, view = infer
    by_op = {c.op.name: c for c in view}
    assert by_op["linear"].cpu_op == OpKey("aten", "addmm") and by_op["linear"].rule == "mps-linear"
    assert by_op["_mps_convolution"].cpu_op == OpKey("aten", "convolution")
    sdpa = by_op["_scaled_dot_product_attention_math_for_mps"]
    assert sdpa.cpu_op == OpKey("aten", "_scaled_dot_product_flash_attention_for_cpu")
    assert by_op["_fused_rms_norm"].rule == "mps-fused-rms-norm"
    assert by_op["linear"].module == "proj" and by_op["_lstm_mps"].module == "lstm"


def test_steered_attention_is_recorded_as_a_group(train):
    trace, _ = train
    steered = [g for g in trace.groups if g.mode == "steer"]
    assert [g.rule for g in steered] == ["mps-sdpa"]
    assert "math path" in steered[0].condition and steered[0].source


def test_composite_callees_replace_the_composite():
    """put has no MPS kernel; it is CompositeExplicitAutograd, and what MPS runs are its callees."""

    class Put(nn.Module):
        def forward(self, x):
            return x.put(torch.tensor([0, 3]), torch.tensor([1.0, 2.0]))

    target = Target("put", "Put", Put(), torch.randn(4), None, None, None)
    view = mps_view(run_trace(target, ScanOptions("put", inference=True), load_knowledge()))
    forward = [(c.op.display, c.cpu_op.display) for c in view if c.phase == "forward" and c.cpu_op]
    # put = clone + put_, and clone is itself composite: empty_strided + copy_ (nested leaves)
    assert forward == [("aten::empty_strided", "aten::put"), ("aten::copy_", "aten::put"),
                       ("aten::put_", "aten::put")]
    assert all(op != "aten::put" for op, _ in forward)


def test_mps_only_ops_are_replayed_from_the_call_the_lens_saw(infer):
    # _fused_rms_norm, attention's MPS kernel and _lstm_mps exist only on MPS: their probes on mps are rebuilt
    # from F.rms_norm / F.scaled_dot_product_attention / torch.lstm's own arguments, not left unknown
    from opscan.probe import calls, replay

    trace, view = infer
    plan = calls.plan(trace, view, "mps")
    by_op = {p.op: p for p in plan.probes}
    assert not [why for why in plan.unreplayable.values() if "_lstm_mps" in why or "rms" in why or "sdpa" in why]
    rms = by_op["aten::_fused_rms_norm"]
    assert [t.shape for t in rms.tensors] == [(2, 3, 8), (8,)]
    assert rms.spec == {"args": [{"t": 0}, [8], {"t": 1}, None], "kwargs": {}}
    sdpa = by_op["aten::_scaled_dot_product_attention_math_for_mps"]
    assert [t.shape for t in sdpa.tensors] == [(2, 1, 3, 8)] * 3
    assert sdpa.spec == {"args": [{"t": 0}, {"t": 1}, {"t": 2}, None, 0.0, False, None],
                         "kwargs": {"scale": None, "enable_gqa": False}}
    lstm = by_op["aten::_lstm_mps"]
    assert lstm.spec["args"][3:] == [True, 1, 0.0, False, False, True]  # has_biases ... batch_first
    assert [t.shape for t in lstm.tensors] == [(2, 3, 8), (1, 2, 8), (1, 2, 8), (32, 8), (32, 8), (32,), (32,)]

    # _fused_rms_norm also has a composite kernel, so its replay runs here and equals F.rms_norm
    func = replay.resolve(rms.op)
    tensors = replay.build(rms, func)
    args, kwargs = replay.materialize(rms, tensors, "cpu", wide=False)
    expected = F.rms_norm(args[0], [8], args[2])
    assert torch.allclose(func(*args, **kwargs)[0], expected)
    # the MPS-only ops bind to their schemas: on the CPU they fail for want of a kernel, not for their arguments
    for probe in (sdpa, lstm):
        func = replay.resolve(probe.op)
        args, kwargs = replay.materialize(probe, replay.build(probe, func), "cpu", wide=False)
        with pytest.raises(NotImplementedError, match="from the 'CPU' backend"):
            func(*args, **kwargs)
