"""Trace stage: the optimizer step is traced as it runs, and attributed to the parameters' modules.

The model is `a` (Linear 4->3), ReLU, `b` (Linear 3->2): four parameters, a.weight, a.bias,
b.weight, b.bias, in that order. Expected lists are the findable optimizer-phase calls as
(module, op); a call touching parameters (or optimizer state made from them) of one module is
that module's, and "" otherwise (step counters, `_foreach_*` over both modules).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers_trace import Wrap, calls_of, ops, run_trace
from opscan.trace import TraceOptions

EAGER = TraceOptions(fx=False)
OWNERS = ["a", "a", "b", "b"]  # the module of each parameter, in parameter order


class Two(nn.Module):
    """Two Linear layers with a ReLU between them."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _step(build_optimizer=None, train_step=None, model=None):
    torch.manual_seed(0)
    return run_trace(model or Two(), torch.randn(2, 4), EAGER,
                     build_optimizer=build_optimizer, train_step=train_step)


def _optimizer_rows(trace):
    return [(c.module, c.op.display) for c in trace.findable() if c.phase == "optimizer"]


def _adamw_for_loop_update(m: str):
    """One parameter's update in _single_tensor_adam (decoupled weight decay)."""
    return [
        ("", "aten::add_.Tensor"),  # step += 1 (the step counter is no parameter's)
        (m, "aten::mul_.Tensor"),  # param.mul_(1 - lr * weight_decay)
        (m, "aten::lerp_.Scalar"),  # exp_avg.lerp_(grad, 1 - beta1)
        (m, "aten::mul_.Tensor"), (m, "aten::addcmul_"),  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad)
        ("", "aten::_local_scalar_dense"),  # _get_value(step): step.item()
        (m, "aten::sqrt"), (m, "aten::div.Tensor"), (m, "aten::add_.Tensor"),  # denom
        (m, "aten::addcdiv_"),  # param.addcdiv_(exp_avg, denom, value=-step_size)
    ]


def _adam_state(m: str, step: str = "aten::lift_fresh"):
    # state["step"] = torch.tensor(0.0) (a lifted constant), exp_avg and exp_avg_sq = zeros_like(p)
    return [("", step), (m, "aten::zeros_like"), (m, "aten::zeros_like")]


def test_default_optimizer_is_adamw_for_loop():
    trace = _step()  # no build_optimizer: AdamW, and on CPU it takes the per-parameter loop
    expected = [row for m in OWNERS for row in _adam_state(m)]
    expected += [row for m in OWNERS for row in _adamw_for_loop_update(m)]
    assert _optimizer_rows(trace) == expected
    assert not [op for op in ops(trace) if "_foreach_" in op]


def test_adamw_foreach_runs_foreach_kernels():
    trace = _step(lambda model: torch.optim.AdamW(model.parameters(), foreach=True))
    expected = [row for m in OWNERS for row in _adam_state(m)]
    expected += [
        ("", "aten::lift_fresh"), ("", "aten::_foreach_add_.Tensor"),  # steps += torch.tensor(1.0)
        ("", "aten::_foreach_mul_.Scalar"),  # weight decay, all four params at once
        ("", "aten::_foreach_lerp_.Scalar"),
        ("", "aten::_foreach_mul_.Scalar"), ("", "aten::_foreach_addcmul_.Scalar"),
        *[("", "aten::_local_scalar_dense")] * 8,  # 1 - beta1**step and 1 - beta2**step, per param
        ("", "aten::_foreach_sqrt"), ("", "aten::_foreach_div_.ScalarList"), ("", "aten::_foreach_add_.Scalar"),
        ("", "aten::_foreach_addcdiv_.ScalarList"),
    ]
    assert _optimizer_rows(trace) == expected
    (update,) = calls_of(trace, "aten::_foreach_addcdiv_.ScalarList")
    assert [t.shape for t in update.inputs[:4]] == [(3, 4), (3,), (2, 3), (2,)]  # the four params


def test_foreach_over_one_module_is_that_modules():
    trace = _step(lambda model: torch.optim.AdamW(model.parameters(), foreach=True), model=Wrap(nn.Linear(4, 3)))
    assert calls_of(trace, "aten::_foreach_add_.Tensor")[0].module == ""  # step counters
    for op in ("aten::_foreach_lerp_.Scalar", "aten::_foreach_addcmul_.Scalar", "aten::_foreach_addcdiv_.ScalarList"):
        assert [(c.module, c.module_source) for c in calls_of(trace, op)] == [("layer", "parameter")]


def test_adamw_fused_runs_the_fused_kernel():
    trace = _step(lambda model: torch.optim.AdamW(model.parameters(), fused=True))
    # fused: state["step"] = torch.zeros((), device=p.device) instead of a lifted constant
    expected = [row for m in OWNERS for row in _adam_state(m, step="aten::zeros")]
    expected += [("", "aten::_foreach_add_.Scalar"), ("", "aten::_fused_adamw_")]
    assert _optimizer_rows(trace) == expected
    (fused,) = calls_of(trace, "aten::_fused_adamw_")
    assert fused.inputs[0].storage == calls_of(trace, "aten::t", "forward")[0].inputs[0].storage  # a.weight


def test_sgd_momentum_first_step():
    trace = _step(lambda model: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    # first step: no momentum buffer yet, so buf = grad.detach().clone(); then param.add_(buf, alpha=-lr)
    assert _optimizer_rows(trace) == [
        row for m in OWNERS for row in [(m, "aten::detach"), (m, "aten::clone"), (m, "aten::add_.Tensor")]
    ]
    assert {c.module_source for c in trace.findable() if c.phase == "optimizer"} == {"parameter"}


def _clipped_bf16_step(model, optimizer, inputs):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(inputs)
    loss = out.float().pow(2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture(scope="module")
def clipped():
    return _step(lambda model: torch.optim.SGD(model.parameters(), lr=0.1), train_step=_clipped_bf16_step)


def test_custom_step_autocast_runs_forward_in_bfloat16(clipped):
    # autocast casts F.linear's input, weight and bias to bfloat16 (three _to_copy for `a`, two
    # for `b`, whose input is already bfloat16)
    assert ops(clipped, "forward") == [
        "aten::_to_copy", "aten::_to_copy", "aten::_to_copy", "aten::t", "aten::addmm",
        "aten::relu", "aten::detach",
        "aten::_to_copy", "aten::_to_copy", "aten::t", "aten::addmm",
    ]
    for addmm in calls_of(clipped, "aten::addmm"):
        assert addmm.dtypes == ("bfloat16", "bfloat16", "bfloat16")
        assert addmm.outputs[0].dtype == "bfloat16"
    casts = calls_of(clipped, "aten::_to_copy", "forward")
    assert {(c.inputs[0].dtype, c.outputs[0].dtype) for c in casts} == {("float32", "bfloat16")}
    assert ops(clipped, "loss") == ["aten::_to_copy", "aten::pow.Tensor_Scalar", "aten::mean", "aten::ones_like"]
    # the float32 parameters get float32 gradients back through the casts' backward
    steals = [c for c in clipped.calls if c.phase == "backward" and c.module_source == "parameter"]
    assert [(c.module, c.inputs[0].dtype) for c in steals] == [("b", "float32")] * 2 + [("a", "float32")] * 2


def test_custom_step_clipping_is_optimizer_phase(clipped):
    assert _optimizer_rows(clipped) == [
        # clip_grad_norm_ runs after backward: phase optimizer, over both modules' grads
        ("", "aten::_foreach_norm.Scalar"),  # per-grad norms
        ("", "aten::stack"), ("", "aten::linalg_vector_norm"),  # total norm
        ("", "aten::add.Tensor"), ("", "aten::reciprocal"), ("", "aten::mul.Tensor"),  # max_norm / (total + 1e-6)
        ("", "aten::clamp"),  # clip_coef.clamp(max=1.0)
        ("", "aten::_foreach_mul_.Tensor"),  # grads *= clip_coef
        # SGD without momentum: param.add_(grad, alpha=-lr), each its module's
        *[(m, "aten::add_.Tensor") for m in OWNERS],
    ]
    (norms,) = calls_of(clipped, "aten::_foreach_norm.Scalar")
    assert [t.dtype for t in norms.inputs] == ["float32"] * 4
