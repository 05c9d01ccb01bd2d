"""A what-if scan judges the C++ composites the trace ran by the predicted-for release's kernels (issue 24 (b):
opscan/predict/release_paths.py, rule `release-callees`, composite_callees.txt read from each release's macOS
libtorch_cpu.dylib). Real models and crafted ones; each test failed before the rule existed:
- attention's `_safe_softmax` called eq/where in 2.5.x, isneginf (no MPS kernel before 2.6) from 2.6: a ViT trained
  on 2.5.0 is native, not dual-track;
- BCE-with-logits took neg/clamp_min_/exp_/log_ until 2.2.2, log_sigmoid (log_sigmoid_forward: no MPS kernel in 2.0)
  from 2.3.0;
- one_hot called min until 2.12, aminmax since 2.13; rms_norm had no _fused_rms_norm before 2.8; group_norm called
  contiguous until 2.13 (what the table says, on the path the step took);
- what is not known is said (an op the release does not declare), never silently judged.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from opscan.knowledge.composite_callees import CalleeTable, load_callees
from opscan.predict import release_paths
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import REPO, TARGETS

PATHS = TARGETS / "release_paths.py"
RELEASES_PY = TARGETS / "releases.py"
VIT = ScanOptions(f"{REPO / 'bench' / 'zoo_models.py'}:vision_transformer", fx=False, memory=False)


def _scan(target: str, release: str, **kw):
    options = ScanOptions(target, fx=False, memory=False, torch_version=release, **kw)
    return scan(options)


def _rows(report) -> dict[str, object]:
    return {row.op.name: row for row in report.rows}


def _notes(report) -> str:
    return " ".join(report.assumptions["notes"])


def test_vit_trained_on_2_5_0_runs_safe_softmax_natively_without_isneginf():
    report = scan(replace(VIT, torch_version="2.5.0"))
    rows = _rows(report)
    assert "isneginf" not in rows
    # every row native but one: the patch-embedding conv's backward meets silent bug 140902 in 2.5.x (its
    # grad_output arrives channels-last strided from flatten(2).transpose(1, 2)) — a real 2.5.x finding, not
    # the attention path this test is about
    others = {str(r.op): r.evidence.rule for r in report.rows if r.verdict is not Verdict.NATIVE}
    assert others == {"aten::mps_convolution_backward": "silent-bug-140902"}, others
    assert rows["eq"].evidence.rule == rows["where"].evidence.rule == "release-callees"
    assert "_safe_softmax" in rows["eq"].evidence.text and "[bin]" in rows["eq"].evidence.source
    assert "_safe_softmax: -isneginf -where.self_out +eq.Tensor +where.self" in _notes(report)


def test_trained_attention_before_2_5_runs_the_math_path_of_its_release():
    report = _scan(f"{RELEASES_PY}:trained_attention", "2.4.0")
    rows = _rows(report)
    assert "_safe_softmax" not in rows and "isneginf" not in rows
    assert rows["softmax"].evidence.rule == "release-callees" and rows["softmax"].verdict is Verdict.NATIVE
    assert "_scaled_dot_product_attention_math: -_safe_softmax" in _notes(report)


@pytest.mark.parametrize("release", ["2.0.0", "2.2.0"])
def test_bce_with_logits_before_2_3_takes_the_log_path(release):
    rows = _rows(_scan(f"{PATHS}:bce_logits", release))
    assert {"neg", "clamp_min_", "exp_", "log_"} <= set(rows)
    assert not {"log_sigmoid", "log_sigmoid_forward"} & set(rows)
    assert all(rows[op].evidence.rule == "release-callees" and rows[op].verdict is Verdict.NATIVE
               for op in ("neg", "clamp_min_", "exp_", "log_"))
    assert str(rows["neg"].cpu_op) == "aten::binary_cross_entropy_with_logits"


def test_bce_with_logits_from_2_3_calls_log_sigmoid_as_traced():
    report = _scan(f"{PATHS}:bce_logits", "2.3.0")
    rows = _rows(report)
    assert "log_sigmoid_forward" in rows and not {"neg", "clamp_min_", "exp_"} & set(rows)
    assert "release-callees: torch 2.3.0's C++ composites" not in _notes(report)


def test_one_hot_before_2_13_calls_min():
    old, new = _scan(f"{PATHS}:one_hot", "2.12.0"), _scan(f"{PATHS}:one_hot", "2.14.1")
    assert _rows(old)["min"].evidence.rule == "release-callees" and _rows(old)["min"].verdict is Verdict.NATIVE
    assert "one_hot: -aminmax +min" in _notes(old)
    assert "min" not in _rows(new) and "release-callees" not in _notes(new)


def test_rms_norm_before_2_8_runs_its_decomposition_and_names_what_is_not_judged():
    rows = _rows(_scan(f"{PATHS}:rms_norm", "2.5.0", inference=True))
    assert "_fused_rms_norm" not in rows and {"pow", "mean", "rsqrt"} <= set(rows)
    report = _scan(f"{PATHS}:rms_norm", "2.7.0", inference=True)
    assert "_fused_rms_norm" not in _rows(report)
    assert "rms_norm: empty_like" in _notes(report) and "not judged" in _notes(report)


def test_group_norm_until_2_13_also_calls_contiguous_on_a_branch_not_taken():
    report = _scan(f"{PATHS}:group_norm", "2.13.0")
    assert "group_norm: contiguous" in _notes(report)
    assert "release-callees" not in {row.evidence.rule for row in report.rows}


def test_an_op_the_release_does_not_declare_is_said_not_known():
    report = _scan(f"{PATHS}:rms_norm", "2.2.0")  # nn.RMSNorm's rms_norm is first declared in 2.4.0
    assert "release-callees-unknown: what torch 2.2.0's C++ kernel of rms_norm calls is not known" in _notes(report)
    assert "what torch 2.2.0's calls is not known" in _rows(report)["rsqrt"].evidence.text


def test_the_installed_release_is_judged_as_traced():
    report = _scan(f"{PATHS}:bce_logits", None)
    assert "log_sigmoid_forward" in _rows(report)
    assert not any(n.startswith("release-callees") for n in report.assumptions["notes"])


def test_mutation_without_the_table_row_the_vit_is_not_native_on_2_5(monkeypatch):
    table = load_callees()
    rows = {r: dict(t) for r, t in table.kernels.items()}
    for release in ("2.5.0", "2.5.1"):
        del rows[release]["_safe_softmax"]
    mutant = CalleeTable(table.releases, rows)
    monkeypatch.setattr(release_paths, "load_callees", lambda: mutant)
    report = _scan(f"{RELEASES_PY}:trained_attention", "2.5.0")
    assert any(row.verdict is not Verdict.NATIVE for row in report.rows)


def test_timm_sapiens2_on_2_0_meets_neither_a_conj_branch_nor_an_unknown_copy():
    """Issue 38: timm's Sapiens2 ViT was dual-track on 2.0-2.3 in the timm-sample board (as aimv2 and mvit_v1_b,
    for the same two causes). 2.0.0's repeat_interleave.self_int kernel "calls" conj_physical on its complex branch —
    for a float32 step it returns the input, nothing runs —, and the copy_ the installed torch's F.rms_norm path
    dispatched (a composite whose 2.0.0 kernel is not known: rule release-callees-unknown) is MPS's own copy whatever
    composite issued it."""
    report = scan(ScanOptions(f"{TARGETS / 'sapiens2_small.py'}:build", torch_version="2.0.0", memory=False))
    assert not [r for r in report.rows if r.op.name == "conj_physical"]
    copies = [r for r in report.rows if r.op.name == "copy_"]
    assert copies and all(r.verdict == Verdict.NATIVE and r.evidence.rule == "mps-copy" for r in copies)
    assert report.lane.name.value == "mac-first"
    assert "repeat_interleave.self_int: conj_physical" in _notes(report)  # said, not judged


def test_a_composite_release_callees_adds_passes_the_dtype_layer_first():
    """At 2.2.0 MPS has no bfloat16 at all: every bfloat16 row is unsupported_dtype, the composites the release's
    math attention calls (softmax.int, zeros_like: judged by their OpInfo samples) included — they were native,
    their samples' callees judged without the call's dtypes."""
    report = _scan(f"{RELEASES_PY}:trained_attention", "2.2.0", dtype="bfloat16")
    added = {row.op.display: row for row in report.rows if row.evidence.rule == "release-callees"}
    assert {"aten::softmax.int", "aten::zeros_like"} <= set(added), sorted(added)
    assert all("BFloat16 is not supported on MPS" in added[op].evidence.text
               for op in ("aten::softmax.int", "aten::zeros_like"))
    bf16 = [row for row in report.rows if "bfloat16" in row.dtypes]
    assert bf16 and all(row.verdict is Verdict.UNSUPPORTED_DTYPE for row in bf16), \
        [(str(r.op), r.verdict) for r in bf16 if r.verdict is not Verdict.UNSUPPORTED_DTYPE]
