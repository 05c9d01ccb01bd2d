"""Predicted verdicts on real models and on the tricky example.

- the tricky example earns every predicted verdict (rows pinned);
- the verdicts come from the data: a yaml without MPS for native_batch_norm makes resnet18's
  batch norm `unsupported`;
- resnet18, BERT, a small LLaMA, a timm ViT and ConvNeXt: every row native, nothing unknown, and each
  model's MPS-view op set pinned per phase in tests/golden/mps_view/ (training and inference).
"""

from __future__ import annotations

import re
import shutil

import pytest

from opscan.knowledge import default_yaml_path
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import EXAMPLES

pytestmark = pytest.mark.slow

RESNET = ScanOptions("torchvision.models:resnet18", inputs=("2x3x64x64:float32",), args={"num_classes": 10})
MODELS = {
    "resnet18": RESNET,
    "bert": ScanOptions(f"{EXAMPLES}/hf_bert.py:build_model"),
    "llama": ScanOptions(f"{EXAMPLES}/llama.py:build_model"),
    "vit": ScanOptions("timm:create_model", inputs=("2x3x32x32:float32",), args={
        "model_name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8, "num_classes": 10}),
    "convnext": ScanOptions("timm:create_model", inputs=("2x3x64x64:float32",), args={
        "model_name": "convnext_atto", "num_classes": 10}),
}


def _rows(report):
    return {(r.op.display, tuple(r.dtypes), r.verdict.value) for r in report.rows if r.verdict != Verdict.NATIVE}


def test_tricky_example_earns_every_predicted_verdict():
    report = scan(ScanOptions(f"{EXAMPLES}/tricky.py:build_model"))
    assert _rows(report) == {
        ("aten::embedding_renorm_", ("float32", "int64"), "cpu_fallback"),  # nn.Embedding(max_norm=1.0)
        ("aten::add.Tensor", ("float64", "float64"), "unsupported_dtype"),  # out.double() + offsets
        ("aten::copy_", ("float64", "float32"), "unsupported_dtype"),  # .double() of a float32
        ("aten::copy_", ("float32", "float64"), "unsupported_dtype"),  # .float() of a float64
        ("aten::take", ("float32", "int64"), "unsupported"),
        ("aten::put_", ("float32", "int64", "float32"), "unsupported"),  # take's backward: put -> put_
        ("aten::_adaptive_avg_pool2d", ("float32",), "error"),  # 7x7 -> 3x3 is not divisible
        ("aten::_adaptive_avg_pool2d_backward", ("float32", "float32"), "error"),
        ("tricky::scale", ("float32",), "unknown"),  # a custom op no table speaks for
    }
    assert report.lane.name == "linux-gpu-first"
    assert any("_adaptive_avg_pool2d" in reason for reason in report.lane.reasons)
    put = next(r for r in report.rows if r.op.name == "put_")
    assert put.cpu_op.display == "aten::put" and put.phases == ("backward",) and put.remedy
    assert all(r.remedy for r in report.rows if r.verdict != Verdict.NATIVE)


def test_verdicts_come_from_the_yaml(tmp_path):
    """Drop MPS from native_batch_norm's dispatch: resnet18's batch norm becomes unsupported."""
    original = default_yaml_path()
    text = open(original, encoding="utf-8").read()
    block = re.search(r"- func: native_batch_norm\(.*?\n\n", text, re.S).group(0)
    mutated = tmp_path / "native_functions.yaml"
    mutated.write_text(text.replace(block, block.replace("    MPS: batch_norm_mps\n", "")), encoding="utf-8")
    shutil.copy(original, tmp_path / "original.yaml")
    before = scan(RESNET)
    after = scan(ScanOptions(**{**RESNET.__dict__, "yaml_path": str(mutated)}))
    verdict = {r.op.name: r.verdict for r in after.rows}
    assert {r.op.name: r.verdict for r in before.rows}["native_batch_norm"] == Verdict.NATIVE
    assert verdict["native_batch_norm"] == Verdict.UNSUPPORTED
    assert verdict["native_batch_norm_backward"] == Verdict.NATIVE  # its own entry still names MPS
    assert after.lane.name == "dual-track"


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_reports(request):
    name = request.param
    options = MODELS[name]
    return name, scan(options), scan(ScanOptions(**{**options.__dict__, "inference": True}))


def test_real_models_are_native_with_nothing_unknown(model_reports):
    name, train, infer = model_reports
    for report in (train, infer):
        assert _rows(report) == set(), name
        assert report.summary["unknown"] == {"ops": 0, "calls": 0}
        assert report.lane.name == "mac-first"
    assert set(train.phases) == {"forward", "loss", "backward", "optimizer"}
    assert set(infer.phases) == {"forward"}


def test_real_models_mps_view_is_pinned(model_reports, golden):
    name, train, infer = model_reports
    golden(f"mps_view/{name}.txt", _op_sets("train", train) + _op_sets("inference", infer))


def _op_sets(mode, report) -> str:
    lines = []
    for phase in report.phases:
        ops = sorted({r.op.display for r in report.rows if phase in r.phases})
        lines.append(f"{mode} {phase}: {' '.join(ops)}")
    return "\n".join(lines) + "\n"
