"""The lens sees calls however deep they sit, and scalar composites keep their callees (issue 14).

Expected values come from what MPS dispatches: nn.MultiheadAttention(need_weights=False) calls
F.multi_head_attention_forward, whose body calls F.linear (packed in-projection, once: q is k is v) and
F.scaled_dot_product_attention (dropout 0); with grad MPS takes attention's math path (bmm, softmax, bmm;
mps_facts.md §8), and runs linear as its own kernel. A TorchFunctionMode never sees those two calls: while
a mode handles F.multi_head_attention_forward it is switched off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from opscan.knowledge import load_knowledge
from opscan.mps_view import mps_view
from opscan.scan import ScanOptions, run_trace, scan
from opscan.target.load import load_target
from opscan.trace import hooks
from opscan.trace.functions import StepFunctions
from opscan.trace.lens import Lens
from opscan.trace.questions import Questions
from opscan.verdict import Verdict

TARGETS = Path(__file__).parent / "targets" / "lens_depth.py"
FLASH = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")


def _view(name: str, inference: bool = False):
    target = load_target(f"{TARGETS}:{name}", {}, [])
    torch.manual_seed(0)
    return mps_view(run_trace(target, ScanOptions(f"{TARGETS}:{name}", inference=inference), load_knowledge()))


def _names(view, phase: str) -> list[str]:
    return [c.op.name for c in view if c.phase == phase]


def _assert_mha_is_what_mps_runs(view) -> None:
    forward, backward = _names(view, "forward"), _names(view, "backward")
    assert not set(FLASH) & {c.op.name for c in view}
    assert forward.count("linear") == 2  # in-projection (packed) and out_proj, each MPS's own linear
    assert backward.count("linear_backward") == 2
    assert forward.count("bmm") == 2 and "_softmax" in forward  # the math path: q @ k^T, softmax, @ v


def test_attention_nested_in_multi_head_attention_forward_is_seen():
    _assert_mha_is_what_mps_runs(_view("mha"))


def test_mha_training_step_is_native_and_mac_first():
    report = scan(ScanOptions(f"{TARGETS}:mha", memory=False))
    assert [r.op.name for r in report.rows if r.verdict != Verdict.NATIVE] == []
    assert report.lane.name == "mac-first"


def _top_level_only(monkeypatch):
    """Mutation: the lens as a TorchFunctionMode was: it acts only on a call the torch-function layer handed
    it at top level (F.linear, F.scaled_dot_product_attention themselves), never on one nested inside another
    torch function's body."""
    handling: list = []
    python_api = {"linear": F.linear, "scaled_dot_product_attention": F.scaled_dot_product_attention,
                  "max_pool2d": F.max_pool2d, "rms_norm": F.rms_norm, "lstm.input": torch.lstm}

    def gate(self, func, types, args=(), kwargs=None):
        handling.append(func)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            handling.pop()

    real = hooks._kernel

    def blind(name, op):
        kernel = real(name, op)
        return lambda *a, **k: kernel(*a, **k) if handling and handling[-1] is python_api[name] \
            else op._op_dk(hooks.CIA_KEY, *a, **k)

    monkeypatch.setattr(StepFunctions, "__torch_function__", gate)
    monkeypatch.setattr(hooks, "_kernel", blind)


def test_mutation_without_nested_calls_the_mha_test_fails(monkeypatch):
    _top_level_only(monkeypatch)
    view = _view("mha")
    with pytest.raises(AssertionError):
        _assert_mha_is_what_mps_runs(view)
    assert set(FLASH) <= {c.op.name for c in view}  # the defect of issue 14: the CPU flash kernel, unsupported
    # the mutant is the old lens, not a dead one: a top-level F.scaled_dot_product_attention is still steered
    top = _top_level_attention()
    assert not set(FLASH) & set(top) and "bmm" in top


def _top_level_attention() -> list[str]:
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            q = x * self.scale
            return F.scaled_dot_product_attention(q, q, q)

    from opscan.target.load import Target

    target = Target("top", "Attention", Attention(), torch.randn(1, 2, 4, 8), None, None, None)
    view = mps_view(run_trace(target, ScanOptions("top"), load_knowledge()))
    return [c.op.name for c in view]


def test_transformer_encoder_inference_takes_mps_branches():
    # eval + inference_mode: the fast path would run _transformer_encoder_layer_fwd on cpu, never on mps
    # (its device list has no mps); the layers then call F.multi_head_attention_forward, whose attention (no
    # grad, q/k/v transposed views, macOS 14) takes the math path on MPS
    view = _view("encoder", inference=True)
    names = {c.op.name for c in view}
    assert not names & {*FLASH, "_transformer_encoder_layer_fwd", "_native_multi_head_attention"}
    assert _names(view, "forward").count("linear") == 2 * 4  # per layer: in-projection, out_proj, linear1, linear2
    report = scan(ScanOptions(f"{TARGETS}:encoder", inference=True, memory=False))
    assert report.lane.name == "mac-first"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._opname)
        return func(*args, **(kwargs or {}))


def _encoder_layer_ops(gate: bool, monkeypatch) -> list[str]:
    """The dispatched ops of an nn.TransformerEncoderLayer in eval + inference_mode under the lens alone (as in
    a memory sizing run, where it is the only torch-function mode)."""
    if not gate:
        monkeypatch.setattr(StepFunctions, "__enter__", lambda self: self)
        monkeypatch.setattr(StepFunctions, "__exit__", lambda self, *exc: None)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True).eval()
    ops = _Ops()
    with torch.inference_mode(), Lens(Questions(lambda op: True, macos=(14, 0))), ops:
        layer(torch.randn(2, 4, 16))
    return ops.names


def test_fast_paths_stay_skipped_under_the_lens(monkeypatch):
    assert "_transformer_encoder_layer_fwd" not in _encoder_layer_ops(True, monkeypatch)
    # mutation: without the torch-function gate has_torch_function() is False and the CPU fast path runs
    assert "_transformer_encoder_layer_fwd" in _encoder_layer_ops(False, monkeypatch)


@pytest.mark.parametrize("release", ["2.3.0", "2.4.0"])
def test_attention_before_2_5_keeps_the_math_path(release):
    # before 2.5 there is no _scaled_dot_product_attention_math_for_mps: MPS ran the math path (attention.cpp's
    # SDPBackend::math default, no _fused_sdp_choice entry for MPS), never the CPU flash kernel
    for name, inference in (("mha", False), ("encoder", True)):
        report = scan(ScanOptions(f"{TARGETS}:{name}", inference=inference, torch_version=release, memory=False))
        names = {r.op.name for r in report.rows}
        assert not names & set(FLASH), (name, release)
        assert "bmm" in names and "_scaled_dot_product_attention_math_for_mps" not in names


SCALAR_CALLEES = {  # composite -> the Tensor overload its CompositeExplicitAutograd kernel calls (yaml)
    "remainder.Scalar": "remainder.Tensor", "bitwise_and.Scalar": "bitwise_and.Tensor",
    "bitwise_or.Scalar": "bitwise_or.Tensor", "bitwise_xor.Scalar": "bitwise_xor.Tensor",
    "fmod.Scalar": "fmod.Tensor", "xlogy.Scalar_Other": "xlogy.Tensor", "copysign.Scalar": "copysign.Tensor",
}


def test_scalar_composites_are_replaced_by_their_callees():
    view = _view("scalars")
    seen = {(c.cpu_op.display.removeprefix("aten::"), c.op.display.removeprefix("aten::"), c.dtypes)
            for c in view if c.rule == "composite-callee" and c.phase == "forward"}
    # the scalar is a 0-dim tensor in the dtype the call computes in: int64 for the ids, float32 for y
    ints = {"remainder.Scalar", "bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar"}
    expected = {(c, t, ("int64",) * 2 if c in ints else ("float32",) * 2) for c, t in SCALAR_CALLEES.items()}
    assert expected <= seen


def test_scalar_composites_are_native_and_the_step_mac_first():
    report = scan(ScanOptions(f"{TARGETS}:scalars", memory=False))
    assert [(r.op.display, r.evidence.rule) for r in report.rows if r.verdict != Verdict.NATIVE] == []
    assert report.lane.name == "mac-first"
