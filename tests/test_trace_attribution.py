"""Trace stage: which module and which phase each recorded call is attributed to.

Forward calls are named by module hooks; backward calls by the autograd node the engine is
running (mapped to the module that created it); gradient accumulation and optimizer calls by the
parameter's owner. These tests run eagerly (fx=False); the fx tests at the end check that fx
changes nothing.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers_trace import calls_of, ops, run_trace
from opscan.trace import TraceOptions
from opscan.trace.records import PHASES

EAGER = TraceOptions(fx=False)


class TinyLM(nn.Module):
    """Embedding, one Linear block and an lm_head whose weight IS the embedding's."""

    def __init__(self, vocab: int = 10, dim: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(torch.relu(self.block(self.embed(ids))))


def _cross_entropy(logits, ids):
    return F.cross_entropy(logits.flatten(0, 1), ids.flatten())


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return run_trace(TinyLM(), torch.randint(0, 10, (2, 5)), EAGER, loss_fn=_cross_entropy)


def _only(calls):
    assert len(calls) == 1, calls
    return calls[0]


# ---------------------------------------------------------------- weight tying


def test_tied_lm_forward_calls_by_module(lm):
    assert ops(lm, "forward", "embed") == ["aten::embedding"]
    # (2, 5, 4) input: folded to (10, 4) for one addmm, then unfolded
    assert ops(lm, "forward", "block") == ["aten::view", "aten::t", "aten::addmm", "aten::view"]
    assert ops(lm, "forward", "") == ["aten::relu", "aten::detach"]  # torch.relu in TinyLM.forward
    # no bias: F.linear goes through matmul, which folds the 3-D input into one mm
    assert ops(lm, "forward", "lm_head") == ["aten::t", "aten::view", "aten::mm", "aten::_unsafe_view"]
    embedding = _only(calls_of(lm, "aten::embedding"))
    lm_head_t = calls_of(lm, "aten::t", "forward")[1]
    assert lm_head_t.module == "lm_head"
    assert lm_head_t.inputs[0].storage == embedding.inputs[0].storage  # the one shared weight


def test_tied_lm_backward_calls_by_module(lm):
    embedding = _only(calls_of(lm, "aten::embedding"))
    weight = embedding.inputs[0].storage
    dense = _only(calls_of(lm, "aten::embedding_dense_backward"))
    assert (dense.phase, dense.module, dense.module_source) == ("backward", "embed", "autograd")
    assert ops(lm, "backward", "lm_head") == [
        "aten::view",  # UnsafeViewBackward0
        "aten::t", "aten::mm", "aten::t",  # MmBackward0, weight side: (grad.t() @ x).t()
        "aten::t", "aten::mm",  # MmBackward0, input side: grad @ weight.t().t()
        "aten::view",  # ViewBackward0 of the folded input
        "aten::t",  # TBackward0: the lm_head share of the shared weight's gradient
    ]
    weight_side, input_side = [c for c in calls_of(lm, "aten::mm", "backward") if c.module == "lm_head"]
    assert input_side.inputs[1].storage == weight  # the tied weight, seen through lm_head
    assert weight_side.inputs[1].storage != weight


def test_tied_weight_gradient_is_accumulated_in_its_owner(lm):
    """The shared weight has one AccumulateGrad; both uses' gradients meet there, under `embed`
    (named_modules meets `embed` first, so it owns the weight)."""
    dense = _only(calls_of(lm, "aten::embedding_dense_backward"))
    lm_head_share = [c for c in calls_of(lm, "aten::t", "backward") if c.module == "lm_head"][-1]
    # the engine sums the two incoming gradients in the AccumulateGrad node's input buffer while
    # it runs the last producer, EmbeddingBackward0: embed's own node
    total = _only([c for c in calls_of(lm, "aten::add.Tensor", "backward")])
    assert total.module == "embed"
    assert {t.storage for t in total.inputs} == {dense.outputs[0].storage, lm_head_share.outputs[0].storage}
    steal = _only([c for c in lm.calls if c.module_source == "parameter" and c.module == "embed"
                   and c.phase == "backward"])
    assert steal.op.display == "aten::detach" and steal.inputs[0].storage == total.outputs[0].storage
    # lm_head owns no parameter: nothing in backward or the optimizer is its by ownership
    assert not [c for c in lm.calls if c.module == "lm_head" and c.module_source == "parameter"]
    assert ops(lm, "optimizer", "lm_head") == []
    assert "aten::addcdiv_" in ops(lm, "optimizer", "embed")


# ---------------------------------------------------------------- phases and bookkeeping


def test_every_call_has_a_phase_in_step_order(lm):
    assert {c.phase for c in lm.calls} <= set(PHASES)
    assert [phase for phase, _ in itertools.groupby(c.phase for c in lm.calls)] == list(PHASES)


def test_loss_calls_land_in_loss(lm):
    assert ops(lm, "loss") == [
        "aten::view", "aten::view",  # logits.flatten(0, 1), ids.flatten()
        "aten::_log_softmax", "aten::detach",  # cross_entropy = log_softmax (its result saved) ...
        "aten::nll_loss_forward",  # ... + nll_loss
        "aten::ones_like",  # loss.backward()'s seed gradient, made before the engine starts
    ]
    assert {c.module for c in lm.calls if c.phase == "loss"} == {""}


def test_a_loss_module_outside_the_model_is_named_by_class():
    torch.manual_seed(0)
    criterion = nn.CrossEntropyLoss()
    trace = run_trace(TinyLM(), torch.randint(0, 10, (2, 5)), EAGER,
                      loss_fn=lambda logits, ids: criterion(logits.flatten(0, 1), ids.flatten()))
    inside = [c for c in trace.calls if c.phase == "loss" and c.module == "<CrossEntropyLoss>"]
    assert [c.op.display for c in inside] == ["aten::_log_softmax", "aten::detach", "aten::nll_loss_forward"]


def test_bookkeeping_calls_are_flagged_and_never_findable(lm):
    bookkeeping = [c for c in lm.calls if c.bookkeeping]
    # Optimizer.step and Optimizer.zero_grad each open and close a record_function range
    assert [c.op.display for c in bookkeeping] == [
        "profiler::_record_function_enter_new", "profiler::_record_function_exit._RecordFunction",
    ] * 2
    assert {c.phase for c in bookkeeping} == {"optimizer"}
    assert all(c.op.namespace == "profiler" for c in bookkeeping)
    assert not [c for c in lm.calls if c.op.namespace == "profiler" and not c.bookkeeping]
    assert lm.findable() == tuple(c for c in lm.calls if not c.bookkeeping)
    assert not {c.index for c in bookkeeping} & {c.index for c in lm.findable()}


# ---------------------------------------------------------------- identical siblings


class Block(nn.Module):
    """Linear + ReLU."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Twin(nn.Module):
    """A stem (so both blocks compute an input gradient) and two blocks of one class."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


# one block's backward, module paths relative to the block
BLOCK_BACKWARD = [
    ("", "aten::detach"), ("", "aten::threshold_backward"),  # ReluBackward0 (saved result unpacked)
    ("lin", "aten::t"), ("lin", "aten::mm"),  # AddmmBackward0: input grad = grad @ W
    ("lin", "aten::t"), ("lin", "aten::mm"), ("lin", "aten::t"),  # ... weight.t() grad
    ("lin", "aten::sum.dim_IntList"), ("lin", "aten::view"),  # ... bias grad
    ("lin", "aten::detach"),  # AccumulateGrad: bias
    ("lin", "aten::t"),  # TBackward0
    ("lin", "aten::detach"),  # AccumulateGrad: weight
]


def _block_backward(trace, prefix: str):
    calls = [c for c in trace.calls if c.phase == "backward"
             and (c.module == prefix or c.module.startswith(prefix + "."))]
    return calls, [(c.module[len(prefix) + 1:], c.op.display) for c in calls]


def test_sibling_blocks_backward_goes_to_each_block():
    torch.manual_seed(0)
    trace = run_trace(Twin(), torch.randn(2, 4), EAGER)
    first, first_rows = _block_backward(trace, "blocks.0")
    second, second_rows = _block_backward(trace, "blocks.1")
    assert first_rows == BLOCK_BACKWARD and second_rows == BLOCK_BACKWARD
    # blocks.1 runs first in backward, then blocks.0; the two never interleave
    assert max(c.index for c in second) < min(c.index for c in first)
    # each block's input-grad mm reads its own weight
    weights = {c.module: c.inputs[0].storage for c in calls_of(trace, "aten::t", "forward")}
    assert len(set(weights.values())) == 3  # stem, blocks.0.lin, blocks.1.lin
    for prefix, calls in (("blocks.0", first), ("blocks.1", second)):
        input_grad_t = calls[2]  # ("lin", "aten::t") feeding the first mm
        assert input_grad_t.inputs[0].storage == weights[f"{prefix}.lin"]


# ---------------------------------------------------------------- activation checkpointing


class Checkpointed(nn.Module):
    """Three blocks; the middle one runs under torch.utils.checkpoint."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(), Block()])
        self.use_reentrant = use_reentrant

    def forward(self, x):
        x = self.blocks[0](x)
        x = checkpoint(self.blocks[1], x, use_reentrant=self.use_reentrant)
        return self.blocks[2](x)


RECOMPUTE = {
    # non-reentrant: the recompute's saved-tensor hooks keep detached copies of what addmm saves
    # (input, weight.t()) and of relu's result
    False: [("blocks.1.lin", "aten::t"), ("blocks.1.lin", "aten::detach"), ("blocks.1.lin", "aten::detach"),
            ("blocks.1.lin", "aten::addmm"), ("blocks.1", "aten::relu"), ("blocks.1", "aten::detach")],
    # reentrant: a plain forward under enable_grad (relu's saved result: detach)
    True: [("blocks.1.lin", "aten::t"), ("blocks.1.lin", "aten::addmm"),
           ("blocks.1", "aten::relu"), ("blocks.1", "aten::detach")],
}


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_recompute_is_backward_of_the_checkpointed_block(use_reentrant):
    torch.manual_seed(0)
    trace = run_trace(Checkpointed(use_reentrant), torch.randn(2, 4), EAGER)
    # forward runs the block once without saving for backward (no detach after relu)
    assert ops(trace, "forward", "blocks.1.lin") == ["aten::t", "aten::addmm"]
    assert ops(trace, "forward", "blocks.1") == ["aten::relu"]
    recomputed = [c for c in trace.calls if c.phase == "backward" and c.module_source == "hooks"]
    assert [(c.module, c.op.display) for c in recomputed] == RECOMPUTE[use_reentrant]
    # then the block's own backward, still attributed to it
    relu_backward = calls_of(trace, "aten::threshold_backward")
    assert [c.module for c in relu_backward] == ["blocks.2", "blocks.1", "blocks.0"]
    assert recomputed[-1].index < relu_backward[1].index
    mms = calls_of(trace, "aten::mm", "backward")
    assert [c.module for c in mms] == ["blocks.2.lin"] * 2 + ["blocks.1.lin"] * 2 + ["blocks.0.lin"]
    assert [c.module for c in calls_of(trace, "aten::addmm", "backward")] == ["blocks.1.lin"]


def test_reentrant_checkpoint_leaves_only_its_own_input_unowned():
    """CheckpointFunction detaches its input into a new leaf; that leaf's AccumulateGrad is the one
    backward call with no module (it is no parameter, and no module made it)."""
    torch.manual_seed(0)
    trace = run_trace(Checkpointed(True), torch.randn(2, 4), EAGER)
    unowned = [c for c in trace.calls if c.phase == "backward" and c.module_source == "none"]
    assert [(c.op.display, c.module) for c in unowned] == [("aten::detach", "")]


# ---------------------------------------------------------------- custom autograd.Function


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class _Scale(nn.Module):
    def forward(self, x):
        return _Twice.apply(x)


class _Sandwich(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.scale, self.b = nn.Linear(4, 4), _Scale(), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.scale(self.a(x)))


def test_custom_function_backward_belongs_to_the_module_that_applied_it():
    # Function.apply is invisible to torch-function modes: its node is claimed when `scale` returns,
    # not by the next module (`b`) that consumes its output
    trace = run_trace(_Sandwich(), torch.randn(2, 4), EAGER)
    assert ops(trace, "forward", "scale") == ["aten::mul.Tensor"]
    assert ops(trace, "backward", "scale") == ["aten::mul.Tensor"]
    assert "aten::mul.Tensor" not in ops(trace, "backward", "b")


# ---------------------------------------------------------------- fx: known differences


FX = TraceOptions(fx=True)


def test_fx_attributes_inlined_module_code_to_its_module():
    torch.manual_seed(0)
    trace = run_trace(Twin(), torch.randn(2, 4), FX)
    assert trace.fx.traced
    assert [c.module for c in calls_of(trace, "aten::relu")] == ["blocks.0", "blocks.1"]
    assert [c.module for c in calls_of(trace, "aten::threshold_backward")] == ["blocks.1", "blocks.0"]


def test_fx_keeps_activation_checkpointing():
    torch.manual_seed(0)
    trace = run_trace(Checkpointed(False), torch.randn(2, 4), FX)
    assert trace.fx.traced
    assert [c.module for c in calls_of(trace, "aten::addmm", "backward")] == ["blocks.1.lin"]
