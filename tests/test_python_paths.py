"""The step as the predicted-for release's own Python code runs it (issue 24, Python half).

Expected ops come from the releases' wheels, not from the scan: py_drift.txt (tools/build_py_drift.py) says which
releases' code of a torch function differs, facts.yaml `earlier_paths` with `from` says what the older code
issued, each with its wheel file and line:
- AdamW 2.0.x: `exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)` (torch/optim/adamw.py:389), lerp_ from 2.1.0;
- Tensor.__rpow__ 2.0.x: `torch.tensor(other, ...) ** self` (torch/_tensor.py:878): lift_fresh + pow.Tensor_Tensor;
- clip_grad_norm_ 2.0.x: torch.norm on the per-tensor path MPS takes (clip_grad.py:59,61) -> norm.ScalarOpt_dim;
- F.multi_head_attention_forward 2.0-2.2, need_weights=True: q / sqrt(E) (functional.py:5434 in 2.2.2): div.Tensor;
- torch.norm / Tensor.norm / F.normalize take _VF.norm on MPS in every release (torch/functional.py:1844): a device
  branch of the trace (mps-norm), not drift;
- F.interpolate's deterministic branch is taken on MPS only from 2.9.0 (`not input.is_cpu`; 2.5-2.8 `is_cuda or
  is_xpu`);
- torch.library.custom_op exists from 2.4.0: a step calling one is an error for 2.3 (rule missing-api).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from conftest import REPO, TARGETS
from opscan.knowledge import load_knowledge
from opscan.knowledge.py_drift import PyDrift, installed_hash, load_py_drift, load_py_review
from opscan.opkey import OpKey, Release
from opscan.predict.calls import predict_call
from opscan.verdict import Verdict
from opscan.predict.python_paths import judged, release_paths
from opscan.scan import ScanOptions, prepare, scan

PATHS = TARGETS / "python_paths.py"


def _scan(target: str, release: str, **options):
    return scan(ScanOptions(target, torch_version=release, memory=False, fx=False, **options))


def _rows(report) -> dict[str, object]:
    return {str(row.op): row for row in report.rows}


def _view_rules(report) -> dict[str, int]:
    return {entry["rule"]: entry["calls"] for entry in report.trace["mps_view"]}


# ---------------------------------------------------------------- the table and its review


def test_the_installed_torch_hashes_as_the_table_says():
    """No network: every covered function of the installed torch has the table's hash for the installed release
    (a table built from other wheels, or left stale by an edit of the normalization, fails here)."""
    table = load_py_drift()
    release = Release.drop_local(str(torch.__version__))
    assert release in table.releases and len(table.rows) > 900
    wrong = [u for u in table.rows if installed_hash(u) != table.hash_in(u, release)]
    assert wrong == []
    assert table.hash_in("torch/optim/adam.py:_single_tensor_adam", "2.0.0") != \
        table.hash_in("torch/optim/adam.py:_single_tensor_adam", "2.1.0")  # the 2.0 moment update (lerp_ later)
    assert table.hash_in("torch/nn/functional.py:grouped_mm", "2.7.1") is None  # F.grouped_mm: absent before 2.8


def test_every_reviewed_version_is_one_the_table_holds():
    table = load_py_drift()
    for unit, classes in load_py_review().items():
        held = set(table.distinct(unit)) | {"-"}
        for found in classes:
            assert found.versions <= held, unit


def _tool():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("build_py_drift", REPO / "tools" / "build_py_drift.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    return tool


def test_the_build_tool_checks_the_installed_column(capsys):
    assert _tool().main(["--installed"]) == 0
    assert "units of torch" in capsys.readouterr().out


def test_the_doc_lists_every_drifted_function_as_the_tool_reports_it(capsys):
    assert _tool().main(["--report"]) == 0
    rows = capsys.readouterr().out.splitlines()
    doc = (REPO / "docs" / "release-drift.md").read_text(encoding="utf-8").splitlines()
    assert len(rows) > 100 and all(row in doc for row in rows)
    assert any("_single_tensor_adam` |" in row and "fact: `aten::lerp_.Scalar`" in row for row in rows)


# ---------------------------------------------------------------- the releases' own paths, on real models


@pytest.fixture(scope="module")
def resnet18():
    """torchvision's resnet18 with the default AdamW step, traced once (fake tensors)."""
    options = ScanOptions("torchvision.models:resnet18", inputs=("2x3x32x32:float32",), args={"num_classes": 10},
                          fake=True, fx=False, memory=False)
    return options, prepare(options)


def test_adamw_on_2_0_0_updates_its_moment_with_mul_and_add_not_lerp_(resnet18):
    options, prepared = resnet18
    old = scan(replace(options, torch_version="2.0.0"), prepared=replace(prepared, kb=load_knowledge(release="2.0.0")))
    rows = _rows(old)
    assert "aten::lerp_.Scalar" not in rows  # releases/2.0.0.txt: lerp.Scalar_out has no MPS kernel: it would block
    assert rows["aten::mul_.Tensor"].verdict.value == "native" and rows["aten::add_.Tensor"].verdict.value == "native"
    assert _view_rules(old)["earlier-path"] == 2 * 62  # mul_ + add_ for each of resnet18's 62 parameters
    assert old.lane.name.value == "mac-first"  # nothing else blocks resnet18 on 2.0.0
    new = scan(replace(options, torch_version="2.1.0"), prepared=replace(prepared, kb=load_knowledge(release="2.1.0")))
    assert _rows(new)["aten::lerp_.Scalar"].verdict.value == "native"  # releases/2.1.0.txt `+op lerp.Scalar_out M`
    assert "earlier-path" not in _view_rules(new)


def test_removing_the_adamw_fact_brings_lerp_back_and_says_the_drift(resnet18):
    """Mutation: without its earlier_paths fact, 2.0.0's AdamW is unreviewed drift, not a silent lerp_ verdict."""
    _, prepared = resnet18
    kb = load_knowledge(release="2.0.0")
    adam = "torch/optim/adam.py:_single_tensor_adam"
    facts = replace(kb.facts, python_paths=tuple(p for p in kb.facts.python_paths if p.from_unit != adam))
    paths = release_paths(prepared.trace, prepared.view, replace(kb, facts=facts))
    assert adam in paths.drifted and any(adam in note for note in paths.notes)
    found = judged(paths, [predict_call(c, kb, {}) for c in paths.view])
    lerp = [f for c, f in zip(paths.view, found) if c.op == OpKey("aten", "lerp_", "Scalar")]
    assert lerp and {f.verdict.value for f in lerp} == {"unsupported"}
    assert all("not checked for torch 2.0.0" in f.evidence.text and adam in f.evidence.text for f in lerp)


def test_removing_a_table_row_says_the_function_is_not_known(resnet18, monkeypatch):
    """Mutation: a function the step ran that py_drift.txt does not cover is named in the notes."""
    _, prepared = resnet18
    kb = load_knowledge(release="2.3.0")
    assert release_paths(prepared.trace, prepared.view, kb).notes == ()
    table = load_py_drift()
    relu = "torch/nn/functional.py:relu"
    cut = PyDrift(table.releases, {u: r for u, r in table.rows.items() if u != relu})
    monkeypatch.setattr("opscan.predict.python_paths.load_py_drift", lambda: cut)
    paths = release_paths(prepared.trace, prepared.view, kb)
    assert paths.drifted == (relu,) and "is not in py_drift.txt" in paths.notes[0]


def test_rpow_on_2_0_0_is_a_tensor_power():
    rows = _rows(_scan(f"{PATHS}:rpow", "2.0.0"))
    assert "aten::pow.Scalar" not in rows  # no MPS kernel in 2.0.0 (releases/2.0.0.txt: pow.Scalar_out M from 2.1)
    assert rows["aten::pow.Tensor_Tensor"].verdict.value == "native"
    assert rows["aten::lift_fresh"].verdict.value == "native"
    kb = load_knowledge(release="2.0.0")  # the backward the fact does not add (its message says why): native
    for op in ("ge.Scalar", "eq.Scalar", "logical_and", "log", "mul.Tensor", "where.self"):
        assert predict_call_native(op, kb), op
    assert "aten::pow.Scalar" in _rows(_scan(f"{PATHS}:rpow", "2.1.0"))


def predict_call_native(op: str, kb) -> bool:
    """`opscan coverage`'s answer (a composite judged by what it calls: logical_and runs logical_and.out)."""
    from opscan.predict.rules import judge_composite

    return judge_composite(OpKey.from_yaml(op), (), kb).verdict.value == "native"


def test_normalize_and_tensor_norm_take_the_vf_norm_path_of_mps_in_every_release():
    for release in ("2.0.0", "2.14.1"):
        report = _scan(f"{PATHS}:normed", release)
        rows = _rows(report)
        assert "aten::norm.ScalarOpt_dim" in rows, release  # (linalg_vector_norm: clip_grad_norm_, 2.1+)
        assert "forward" not in rows.get("aten::linalg_vector_norm", replace(rows["aten::norm.ScalarOpt_dim"],
                                                                             phases=())).phases, release
        assert _view_rules(report)["mps-norm"] >= 2, release  # F.normalize's and Tensor.norm's torch.norm


def test_clip_grad_norm_on_2_0_0_calls_torch_norm():
    old, new = _rows(_scan(f"{PATHS}:rpow", "2.0.0")), _rows(_scan(f"{PATHS}:rpow", "2.1.0"))
    assert "aten::linalg_vector_norm" not in old and old["aten::norm.ScalarOpt_dim"].verdict.value == "native"
    assert "aten::linalg_vector_norm" in new  # 2.1.0+: torch.linalg.vector_norm per gradient


def test_mha_with_need_weights_divides_the_query_before_2_3():
    prepared = prepare(ScanOptions(f"{PATHS}:mha", memory=False, fx=False))
    mha = "torch/nn/functional.py:multi_head_attention_forward"

    def made(release):  # (op, the fact's first words) of the view calls an earlier path made in MHA
        paths = release_paths(prepared.trace, prepared.view, load_knowledge(release=release))
        return [(c.op.display, f.message[:24]) for c, f in zip(paths.view, paths.origin) if f and f.from_unit == mha]

    assert made("2.1.0") == [("aten::div.Tensor", "with need_weights=True (")] + [
        ("aten::view", "the attention output was")]  # q / sqrt(E); the 2-D output's .contiguous().view()
    assert made("2.3.0") == [("aten::view", "the attention output was")]
    assert made("2.13.0") == []
    rows = _rows(_scan(f"{PATHS}:mha", "2.1.0"))
    assert rows["aten::div.Tensor"].verdict.value == "native"


def test_deterministic_interpolate_takes_the_decomposition_only_from_2_9():
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        old, new = _scan(f"{PATHS}:upsample", "2.8.0"), _scan(f"{PATHS}:upsample", "2.9.0")
    finally:
        torch.use_deterministic_algorithms(before)
    assert "aten::upsample_bilinear2d" in _rows(old) and "mps-interpolate-deterministic" not in _view_rules(old)
    assert "aten::upsample_bilinear2d" not in _rows(new) and "mps-interpolate-deterministic" in _view_rules(new)


def test_a_custom_op_is_an_error_before_torch_2_4():
    old = _scan(f"{PATHS}:custom", "2.3.0")
    row = _rows(old)["opscan_test::double"]
    assert (row.verdict.value, row.evidence.rule) == ("error", "missing-api")
    assert "torch 2.3.0 has no torch.library.custom_op" in row.evidence.text and "2.4.0" in row.remedy
    assert any("torch.library.custom_op" in note for note in old.trace["notes"])
    new = _rows(_scan(f"{PATHS}:custom", "2.4.0"))["opscan_test::double"]
    assert new.evidence.rule != "missing-api"


def test_f_pad_bound_to_c_in_2_0_is_no_missing_api():
    """2.0.0's torch/nn/functional.py binds `pad = _add_docstr(torch._C._nn.pad, ...)` (py_drift.txt's `<assign>pad`
    unit; a Python `def pad` only from 2.2.0, which ends in the same torch._C._nn.pad): F.pad exists there."""
    report = _scan(f"{PATHS}:padded", "2.0.0")
    row = _rows(report)["aten::constant_pad_nd"]
    assert (row.verdict.value, row.evidence.rule) != ("error", "missing-api")
    assert row.verdict.value == "native" and not any("functional.pad" in n for n in report.trace["notes"])


def test_rms_norm_is_missing_before_2_4_unless_timm_looks_it_up_first():
    """F.rms_norm arrived in torch 2.4.0: a step calling it fails on 2.3.0. timm 1.0.31's RmsNorm imports it with
    `try: from torch.nn.functional import rms_norm / except ImportError: from .fast_norm import rms_norm`
    (timm/layers/norm.py): on 2.3.0 timm runs its own pow/mean/rsqrt, so its calls are no error (drift, noted)."""
    direct = _scan(f"{PATHS}:rms", "2.3.0")
    assert any(r.evidence.rule == "missing-api" and "torch.nn.functional.rms_norm" in r.evidence.text
               for r in direct.rows)
    timm = _scan(f"{PATHS}:timm_rms", "2.3.0")
    assert not any(r.evidence.rule == "missing-api" for r in timm.rows)
    assert any("torch/nn/functional.py:rms_norm" in n and "no earlier_paths fact" in n for n in timm.trace["notes"])
    assert not any(r.evidence.rule == "missing-api" for r in _scan(f"{PATHS}:rms", "2.4.0").rows)


def test_the_trace_names_the_torch_function_that_issued_each_call():
    options = ScanOptions(f"{PATHS}:rpow", memory=False, fx=False)
    trace = prepare(options).trace
    by_op = {c.op.display: c for c in trace.calls}
    assert by_op["aten::pow.Scalar"].py[0] == "torch/_tensor.py:Tensor.__rpow__"
    assert by_op["aten::lerp_.Scalar"].py[0] == "torch/optim/adam.py:_single_tensor_adam"
    assert by_op["aten::addmm"].py[0] == "torch/nn/modules/linear.py:Linear.forward"
    assert by_op["aten::pow.Scalar"].caller[0] == os.fspath(PATHS)  # the step's own line that called it


@pytest.mark.parametrize(("release", "verdict", "rule"), [
    ("2.0.0", Verdict.UNSUPPORTED, "torchvision-mps-later"),  # roi_align's MPS kernel: torchvision 0.16 / torch 2.1
    ("2.2.0", Verdict.NATIVE, "torchvision-mps"),
])
def test_a_torch_api_only_torchvision_calls_is_torchvisions_drift_not_a_missing_api(release, verdict, rule):
    # torchvision 0.29.1 registers roi_align's autograd with torch.library.register_autograd (torch 2.4.0+); the
    # torchvision paired with torch 2.0-2.3 did it in C++: the R-CNN detectors were linux-gpu-first on 2.0-2.3 by a
    # false missing-api error (docs/leaderboard/CHANGES.md)
    from opscan.scan import ScanOptions, scan

    report = scan(ScanOptions(f"{TARGETS / 'roi_pool.py'}:build_model", torch_version=release, memory=False))
    rows = {r.op.display: r for r in report.rows if r.op.namespace == "torchvision"}
    assert set(rows) == {"torchvision::roi_align", "torchvision::_roi_align_backward"}
    assert all((r.verdict, r.evidence.rule) == (verdict, rule) for r in rows.values())
    assert not any("missing-api" in n for n in report.trace["notes"])


ISSUE_38_UNITS = (
    "torch/autograd/__init__.py:grad",
    "torch/distributions/bernoulli.py:Bernoulli.log_prob",
    "torch/distributions/categorical.py:Categorical.__init__",
    "torch/distributions/categorical.py:Categorical.entropy",
    "torch/distributions/categorical.py:Categorical.log_prob",
    "torch/distributions/categorical.py:Categorical.probs",
    "torch/distributions/constraints.py:_GreaterThan.check",
    "torch/distributions/constraints.py:_Real.check",
    "torch/distributions/distribution.py:Distribution.__init__",
    "torch/distributions/distribution.py:Distribution._validate_sample",
    "torch/distributions/independent.py:Independent.entropy",
    "torch/distributions/independent.py:Independent.expand",
    "torch/distributions/independent.py:Independent.log_prob",
    "torch/distributions/kl.py:_kl_normal_normal",
    "torch/distributions/kl.py:kl_divergence",
    "torch/distributions/normal.py:Normal.__init__",
    "torch/distributions/normal.py:Normal.entropy",
    "torch/distributions/normal.py:Normal.expand",
    "torch/distributions/normal.py:Normal.log_prob",
    "torch/distributions/normal.py:Normal.rsample",
    "torch/distributions/transformed_distribution.py:TransformedDistribution.log_prob",
    "torch/distributions/transformed_distribution.py:TransformedDistribution.rsample",
    "torch/distributions/transforms.py:TanhTransform._call",
    "torch/distributions/transforms.py:TanhTransform.log_abs_det_jacobian",
    "torch/distributions/transforms.py:Transform.__call__",
    "torch/distributions/utils.py:_standard_normal",
    "torch/distributions/utils.py:_sum_rightmost",
    "torch/distributions/utils.py:broadcast_all",
    "torch/distributions/utils.py:lazy_property.__get__",
    "torch/distributions/utils.py:logits_to_probs",
    "torch/nn/modules/transformer.py:Transformer.forward",
    "torch/nn/modules/transformer.py:TransformerDecoder.forward",
    "torch/nn/modules/transformer.py:TransformerEncoder.forward",
    "torch/nn/utils/spectral_norm.py:SpectralNorm.__call__",
    "torch/nn/utils/spectral_norm.py:SpectralNorm.compute_weight",
    "torch/nn/utils/spectral_norm.py:SpectralNorm.reshape_weight_to_matrix",
)


def test_the_36_drifted_functions_are_covered_in_every_release():
    """Issue 38: the 36 functions docs/release-drift.md named as drifted with no fact or review (33 of them not even in
    py_drift.txt) are each, in every release, the installed torch's code, a reviewed same-ops version, or covered by an
    earlier_paths fact."""
    from opscan.knowledge.py_drift import installed_hash, load_py_drift, same_ops

    table, uncovered = load_py_drift(), []
    for unit in ISSUE_38_UNITS:
        mine = installed_hash(unit)
        assert mine is not None, unit  # the table holds it (py_drift_scope.txt)
        for release in table.releases:
            theirs = table.hash_in(unit, release)
            facts = {p.from_unit for p in load_knowledge(release=release).facts.python_paths}
            if theirs != mine and not same_ops(unit, theirs, mine) and unit not in facts:
                uncovered.append((unit, release))
    assert uncovered == []


def test_a_distributions_step_is_covered_in_every_release():
    """Issue 38: torch.distributions' functions are in py_drift.txt (tools/py_drift_scope.txt), so the trace names the
    one that issued each call; their versions are reviewed (Normal, broadcast_all) or stated (Distribution's
    validation: valid.all() before 2.7.0, an earlier_paths fact), so no scan says their code is unreviewed."""
    trace = prepare(ScanOptions(f"{TARGETS / 'distributions_step.py'}:build", memory=False, fx=False)).trace
    issued = {u for c in trace.calls for u in c.py}
    assert {"torch/distributions/normal.py:Normal.log_prob", "torch/distributions/utils.py:broadcast_all"} <= issued
    for release in ("2.0.0", "2.6.0", "2.7.0"):
        report = scan(ScanOptions(f"{TARGETS / 'distributions_step.py'}:build", torch_version=release, memory=False,
                                  fx=False))
        notes = " ".join(report.assumptions["notes"])
        assert "torch/distributions" not in notes, (release, notes)
        assert report.lane.name.value == "mac-first", release
