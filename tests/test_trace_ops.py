"""Trace stage: the exact aten calls PyTorch dispatches for common layers, in training and inference.

Every expected list below is what torch's CPU dispatcher hands a TorchDispatchMode (bookkeeping
excluded), checked op by op; comments say where each call comes from. Each layer is held by
`Wrap` as `layer`, so its calls are attributed to the module path "layer". Inputs never require
grad, so backward computes parameter gradients only. The default loss is `outputs.sum()`: its
`sum` and the `ones_like` seed that `.backward()` creates are the loss phase, and its
SumBackward0 (`expand`) opens the backward phase, attributed to the root "".
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from helpers_trace import Wrap, calls_of, ops, run_trace
from opscan.trace import TraceOptions


class Attn(nn.Module):
    """Scaled dot-product attention with a learnable query; keys and values are the input."""

    def __init__(self):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 2, 3, 4))

    def forward(self, kv):
        return F.scaled_dot_product_attention(self.query, kv, kv)


# AddmmBackward0 for y = addmm(b, x, W.t()): the grad of W.t() is (grad.t() @ x).t() (t, mm, t);
# the bias grad is grad.sum(0, keepdim=True) reshaped to (3,) (sum.dim_IntList, view); then
# TBackward0 (t) turns the grad of W.t() into W's. Each parameter's AccumulateGrad steals the
# finished gradient with one `detach`.
_LINEAR_BWD_CORE = [
    "aten::t", "aten::mm", "aten::t",
    "aten::sum.dim_IntList", "aten::view",
    "aten::detach",  # AccumulateGrad: bias
    "aten::t",  # TBackward0
    "aten::detach",  # AccumulateGrad: weight
]

_LSTM_FWD_INFERENCE = [
    "aten::zeros", "aten::zeros",  # h0 and c0
    "aten::transpose.int", "aten::clone",  # batch_first input made time-major and contiguous
    "aten::select.int", "aten::select.int",  # h0[0] and c0[0] for layer 0
    "aten::mkldnn_rnn_layer",  # the CPU (oneDNN) LSTM layer kernel
    "aten::stack", "aten::stack",  # h_n and c_n
    "aten::transpose.int",  # output back to batch-first
]

_RMS_FWD = [
    # the rms_norm composite on CPU: x * rsqrt(mean(x**2, -1, keepdim) + eps) * weight
    "aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::add_.Scalar", "aten::rsqrt",
    "aten::mul.Tensor", "aten::mul.Tensor",
]

# name: (model factory, input factory, forward, backward, inference forward, fx node names)
CASES = {
    "linear": (
        lambda: Wrap(nn.Linear(4, 3)), lambda: torch.randn(2, 4),
        ["aten::t", "aten::addmm"],  # F.linear on 2-D input: addmm(bias, x, weight.t())
        ["aten::expand", *_LINEAR_BWD_CORE],
        ["aten::t", "aten::addmm"],
        {"layer"},
    ),
    "linear_3d": (
        lambda: Wrap(nn.Linear(4, 3)), lambda: torch.randn(2, 5, 4),
        # a contiguous 3-D input is folded to (10, 4) for one addmm, and the result unfolded
        ["aten::view", "aten::t", "aten::addmm", "aten::view"],
        ["aten::expand", "aten::view", *_LINEAR_BWD_CORE],  # ViewBackward0 refolds the grad first
        ["aten::view", "aten::t", "aten::addmm", "aten::view"],
        {"layer"},
    ),
    "conv2d": (
        lambda: Wrap(nn.Conv2d(2, 3, 3)), lambda: torch.randn(1, 2, 5, 5),
        ["aten::convolution"],  # conv2d is a composite; convolution's callees run below the mode
        # one convolution_backward computes weight and bias grads (output_mask: no input grad)
        ["aten::expand", "aten::convolution_backward", "aten::detach", "aten::detach"],
        ["aten::convolution"],
        {"layer"},
    ),
    "maxpool2d": (
        # a 1x1 conv in front gives the pool an input that requires grad (and the step a parameter)
        lambda: nn.Sequential(nn.Conv2d(1, 1, 1), nn.MaxPool2d(2)), lambda: torch.randn(1, 1, 4, 4),
        ["aten::convolution", "aten::max_pool2d_with_indices"],  # CPU max_pool2d keeps the indices
        ["aten::expand", "aten::max_pool2d_with_indices_backward", "aten::convolution_backward",
         "aten::detach", "aten::detach"],
        ["aten::convolution", "aten::max_pool2d_with_indices"],
        {"_0", "_1"},  # fx names Sequential's children "_0", "_1"
    ),
    "lstm": (
        lambda: Wrap(nn.LSTM(3, 4, batch_first=True), first=True), lambda: torch.randn(2, 5, 3),
        # training: autograd saves the layer's three outputs (one detach each)
        _LSTM_FWD_INFERENCE[:7] + ["aten::detach"] * 3 + _LSTM_FWD_INFERENCE[7:],
        ["aten::expand",
         "aten::transpose.int",  # TransposeBackward0
         "aten::detach", "aten::detach", "aten::detach",  # the saved outputs, unpacked
         "aten::mkldnn_rnn_layer_backward",
         "aten::detach", "aten::detach", "aten::detach", "aten::detach"],  # AccumulateGrad x 4 params
        _LSTM_FWD_INFERENCE,
        {"layer"},
    ),
    "sdpa": (
        lambda: Wrap(Attn()), lambda: torch.randn(1, 2, 3, 4),
        # CPU picks the flash kernel for 4-D float32 q/k/v; autograd saves its output (detach)
        ["aten::_scaled_dot_product_flash_attention_for_cpu", "aten::detach"],
        ["aten::expand",
         "aten::detach",  # the saved output, unpacked
         "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
         # the query's grad comes back with strides (24, 4, 8, 1), not the parameter's
         # (24, 12, 4, 1): AccumulateGrad copies it into a tensor laid out like the parameter
         "aten::new_empty_strided", "aten::copy_"],
        ["aten::_scaled_dot_product_flash_attention_for_cpu"],
        {"scaled_dot_product_attention"},  # fx traces into Attn (not a leaf module)
    ),
    "rmsnorm": (
        lambda: Wrap(nn.RMSNorm(4)), lambda: torch.randn(2, 4),
        _RMS_FWD,
        # MulBackward0 (of `* weight`): the weight grad is (grad * normed).sum(0) -> (4,)
        ["aten::expand", "aten::mul.Tensor", "aten::sum.dim_IntList", "aten::view", "aten::detach"],
        _RMS_FWD,
        {"layer"},
    ),
}

FX = [pytest.param(False, id="eager"), pytest.param(True, id="fx")]


def _trace(name: str, *, fx: bool, inference: bool = False):
    make_model, make_input = CASES[name][:2]
    torch.manual_seed(0)
    return run_trace(make_model(), make_input(), TraceOptions(inference=inference, fx=fx))


@pytest.mark.parametrize("fx", FX)
@pytest.mark.parametrize("name", CASES)
def test_training_forward_and_backward_ops(name, fx):
    forward, backward = CASES[name][2:4]
    trace = _trace(name, fx=fx)
    assert trace.mode == "train"
    assert ops(trace, "forward") == forward
    assert ops(trace, "loss") == ["aten::sum", "aten::ones_like"]
    assert ops(trace, "backward") == backward


@pytest.mark.parametrize("fx", FX)
@pytest.mark.parametrize("name", CASES)
def test_inference_runs_forward_only(name, fx):
    trace = _trace(name, fx=fx, inference=True)
    assert trace.mode == "inference"
    assert {c.phase for c in trace.calls} == {"forward"}
    # Under inference_mode the autograd keys are skipped, so composites (linear, conv2d,
    # rms_norm, scaled_dot_product_attention, lstm) reach the recorder whole: it records their
    # decomposition, which is what runs — the training forward without autograd's saves.
    assert ops(trace) == CASES[name][4]


@pytest.mark.parametrize("inference", [False, True], ids=["train", "inference"])
@pytest.mark.parametrize("name", CASES)
def test_fx_changes_no_call_only_names_nodes(name, inference):
    eager = _trace(name, fx=False, inference=inference)
    traced = _trace(name, fx=True, inference=inference)
    assert not eager.fx.traced and eager.fx.reason == "disabled (--no-fx)"
    assert traced.fx.traced and traced.fx.nodes > 0

    def rows(trace):
        return [(c.op.display, c.phase, c.bookkeeping) for c in trace.calls]

    assert rows(eager) == rows(traced)
    assert all(c.fx_node is None for c in eager.calls)
    forward = [c for c in traced.calls if c.phase == "forward"]
    assert {c.fx_node for c in forward} == CASES[name][5]
    assert all(c.fx_node is None for c in traced.calls if c.phase != "forward")


@pytest.mark.parametrize("name", CASES)
def test_fx_keeps_module_attribution(name):
    eager = _trace(name, fx=False)
    traced = _trace(name, fx=True)
    assert [(c.module, c.module_source) for c in eager.calls] == [(c.module, c.module_source) for c in traced.calls]


@pytest.mark.parametrize("name", CASES)
def test_layer_calls_are_attributed_to_the_layer(name):
    trace = _trace(name, fx=False)
    layers = {path for path, _ in trace.modules if path and "." not in path}  # "layer", or "0"/"1"
    forward = [c for c in trace.calls if c.phase == "forward"]
    backward = [c for c in trace.calls if c.phase == "backward"]
    assert {c.module for c in forward} <= layers and {c.module_source for c in forward} == {"hooks"}
    # the first backward call is the loss's SumBackward0, made outside the model
    assert (backward[0].op.display, backward[0].module) == ("aten::expand", "")
    assert {c.module for c in backward[1:]} <= layers
    # AccumulateGrad calls are found from the parameter's owner, the rest from the autograd node
    sources = {c.module_source for c in backward[1:]}
    assert sources == {"autograd", "parameter"}


def test_dtypes_shapes_and_devices_are_recorded():
    trace = _trace("linear", fx=False)
    (addmm,) = calls_of(trace, "aten::addmm")
    # addmm(bias (3,), x (2, 4), weight.t() (4, 3)) -> (2, 3), float32 on the CPU
    assert [t.shape for t in addmm.inputs] == [(3,), (2, 4), (4, 3)]
    assert addmm.dtypes == ("float32", "float32", "float32")
    assert addmm.inputs[2].stride == (1, 4)  # weight.t() is a transposed view of (3, 4)
    assert [(t.shape, t.nbytes, t.device) for t in addmm.outputs] == [((2, 3), 24, "cpu")]  # 6 * 4 bytes
    assert trace.device == "cpu" and trace.model_class == "Wrap"
    assert trace.modules == (("", "Wrap"), ("layer", "Linear"))


class _StorageNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        h.relu_()  # in place
        flat = h.view(-1)  # a view
        return flat * 2  # a new tensor


def test_storage_identity_in_place_view_and_distinct():
    trace = run_trace(_StorageNet(), torch.randn(2, 4), TraceOptions(fx=False))
    (t,) = calls_of(trace, "aten::t", "forward")
    (addmm,) = calls_of(trace, "aten::addmm")
    (relu_,) = calls_of(trace, "aten::relu_")
    (view,) = calls_of(trace, "aten::view", "forward")
    (mul,) = calls_of(trace, "aten::mul.Tensor", "forward")
    # in place: relu_ returns its own input, and the input is addmm's result
    assert relu_.outputs[0].storage == relu_.inputs[0].storage == addmm.outputs[0].storage
    # views share their base's storage: weight.t() and h.view(-1)
    assert t.outputs[0].storage == t.inputs[0].storage
    assert view.outputs[0].storage == view.inputs[0].storage == relu_.outputs[0].storage
    # different tensors have different storages: weight vs bias vs input, and mul's new result
    bias, x, weight_t = addmm.inputs
    assert len({bias.storage, x.storage, weight_t.storage, addmm.outputs[0].storage}) == 4
    assert mul.outputs[0].storage != mul.inputs[0].storage
    assert all(m.storage > 0 for c in trace.calls for m in (*c.inputs, *c.outputs))


@torch.library.custom_op("opscan_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """A custom operator: opaque to the recorder, which sees it and not the `mul` inside."""
    return x * 2


twice.register_autograd(lambda ctx, grad: grad * 2)


class _Detector(nn.Module):
    """Scores three fixed boxes, keeps the ones NMS keeps, and doubles them with a custom op."""

    def __init__(self):
        super().__init__()
        self.score = nn.Linear(4, 1)
        # IoU(box 0, box 1) = 4 / 4.41 = 0.91 > 0.5: NMS drops one of them; box 2 is disjoint
        self.register_buffer("boxes", torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.1, 2.1], [5.0, 5.0, 6.0, 6.0]]))

    def forward(self, x):
        scores = self.score(x).squeeze(-1)
        keep = torchvision.ops.nms(self.boxes, scores.detach(), 0.5)
        return twice(scores[keep])


@pytest.mark.parametrize("inference", [False, True], ids=["train", "inference"])
@pytest.mark.parametrize("fx", FX)
def test_non_aten_ops_are_recorded(fx, inference):
    trace = run_trace(_Detector(), torch.randn(3, 4), TraceOptions(fx=fx, inference=inference))
    assert ops(trace, "forward") == [
        "aten::t", "aten::addmm",  # score
        "aten::squeeze.dim", "aten::detach",
        "torchvision::nms",
        "aten::index.Tensor",  # scores[keep]
        "opscan_test::twice",  # its body's aten::mul runs below the recorder and is not seen
    ]
    (nms,) = calls_of(trace, "torchvision::nms")
    assert (nms.op.namespace, nms.op.name, nms.op.overload) == ("torchvision", "nms", "default")
    assert nms.dtypes == ("float32", "float32") and not nms.bookkeeping
    assert [(t.dtype, t.shape) for t in nms.outputs] == [("int64", (2,))]  # 2 of 3 boxes kept
    (custom,) = calls_of(trace, "opscan_test::twice")
    assert custom.module == "" and custom.inputs[0].shape == (2,) and custom in trace.findable()
    if fx:
        assert (nms.fx_node, custom.fx_node) == ("nms", "twice_default")


class _LazyTorchvision(nn.Module):
    """A forward that imports torchvision lazily, as bench/zoo_applied.py's detection heads first did: importing
    torchvision runs torchvision/extension.py's _check_cuda_version(), which calls
    torch.ops.torchvision._cuda_version() (no tensor in, an int out)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        torch.ops.torchvision._cuda_version()
        return self.lin(x)


def test_torchvisions_import_time_version_check_is_bookkeeping():
    # issue 25's zoo: nms_detector at 2.4.0, scanned alone, was dual-track by one unknown row,
    # torchvision::_cuda_version (torchvision-not-in-table): a tensor-less version query, never device work
    trace = run_trace(_LazyTorchvision(), torch.randn(3, 4), TraceOptions())
    (query,) = calls_of(trace, "torchvision::_cuda_version")
    assert query.bookkeeping and query not in trace.findable()
    assert "torchvision::_cuda_version" not in ops(trace, "forward")


def test_custom_op_backward_runs_its_registered_formula():
    trace = run_trace(_Detector(), torch.randn(3, 4), TraceOptions(fx=False))
    assert ops(trace, "backward") == [
        "aten::expand",  # SumBackward0
        "aten::mul.Tensor",  # twice's registered backward: grad * 2 (module "", where it was called)
        "aten::new_zeros", "aten::index_put",  # IndexBackward0: scatter into zeros of (3,)
        "aten::unsqueeze",  # SqueezeBackward1
        *_LINEAR_BWD_CORE,  # score's AddmmBackward0, TBackward0 and AccumulateGrads
    ]
    assert [c.module for c in trace.calls if c.phase == "backward"][:5] == ["", "", "", "", ""]
