"""`opscan coverage`, what-if scans (--torch-version, --macos) and upgrade advice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from opscan.cli import main
from opscan.predict.coverage import coverage
from opscan.knowledge import default_yaml_path, installed_release, kb_releases, load_knowledge
from opscan.knowledge.yaml_index import MPS, essential_lines, index_entries
from opscan.opkey import OpKey
from opscan.scan import ScanOptions, scan

from conftest import TARGETS

K = OpKey.parse
INSTALLED = installed_release()
RELEASES = f"{TARGETS / 'releases.py'}"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """main(argv) -> (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return int(code), out, err


@pytest.fixture(scope="module")
def cov_2_14_1():
    code = main(["coverage", "--torch-version", "2.14.1", "--format", "json"])
    assert code == 0
    return None


def _json(capsys, *argv) -> dict:
    code, out, err = run(capsys, "coverage", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_mps_kernel_rows_are_the_912_yaml_registrations(capsys):
    data = _json(capsys, "--torch-version", "2.14.1")
    mps = {OpKey.from_json(r["op"], r["overload"]) for r in data["ops"] if r["kernel"] == "mps"}
    assert len(mps) == 912 and data["summary"]["kernel"]["mps"] == 912  # mps_facts §2: 549 + 363
    if INSTALLED == "2.14.1":  # the same set, computed independently from the installed wheel's whole yaml
        with open(default_yaml_path(), encoding="utf-8") as fh:
            index = index_entries(yaml.safe_load(essential_lines(fh.read())))  # not through the kb's records
        def own_or_delegated(o):
            delegate = index.get(o.structured_delegate) if o.structured_delegate else None
            return MPS in o.dispatch or (delegate is not None and MPS in delegate.dispatch)

        assert mps == {op for op, o in index.items() if own_or_delegated(o)}
    rows = {(r["op"], r["overload"]): r for r in data["ops"]}
    renorm = rows[("aten::embedding_renorm_", "default")]
    assert (renorm["kernel"], renorm["status"], renorm["evidence"]["rule"]) == ("cpu_fallback", "cpu_fallback",
                                                                               "always-cpu")
    stub = rows[("aten::_slow_conv2d_forward", "default")]
    assert (stub["status"], stub["evidence"]["rule"]) == ("error", "error-stub") and "stub" in stub["evidence"]["text"]
    assert rows[("aten::_ctc_loss", "default")]["since"] == "2.14.0"
    assert rows[("aten::linear", "default")]["since"] == "2.0.0"
    assert set(data) >= {"release", "macos", "kb_version", "summary", "ops"} and data["release"] == "2.14.1"


def test_every_row_has_a_verdict_a_kernel_and_evidence():
    cov = coverage("2.11.0", with_since=False)
    kernels = {r.kernel for r in cov.rows}
    assert kernels == {"mps", "composite", "python", "cpu_fallback", "none"}
    assert all(r.evidence.rule and r.evidence.source and "2.11.0" in r.evidence.text for r in cov.rows)
    python = {r.op for r in cov.rows if r.kernel == "python"}
    assert python == {K("aten::native_group_norm"), K("aten::native_group_norm_backward")}  # mps_facts §2
    generated = next(r for r in cov.rows if r.op == K("aten::_ctc_loss.out"))  # autogen: calls _ctc_loss
    assert generated.kernel == "composite" and generated.evidence.rule == "composite-callees"


def test_filters_and_formats(capsys):
    data = _json(capsys, "--torch-version", "2.13.0", "--op", "*ctc_loss*", "--status", "unsupported")
    names = {(r["op"], r["overload"]) for r in data["ops"]}
    assert ("aten::_ctc_loss", "default") in names and all(r["status"] == "unsupported" for r in data["ops"])
    code, out, _ = run(capsys, "coverage", "--torch-version", "2.0.0", "--op", "bitwise_and", "--no-since",
                       "--format", "yaml")
    rows = {(r["op"], r["overload"]): r for r in yaml.safe_load(out)["ops"]}
    assert code == 0 and rows[("aten::bitwise_and", "Tensor_out")]["evidence"]["rule"] == "mps-outside-yaml"
    code, out, _ = run(capsys, "coverage", "--torch-version", "2.14.1", "--kernel", "cpu_fallback")
    assert code == 0 and "aten::embedding_renorm_" in out and "kernel: mps 0 · composite 0" in out
    code, _, err = run(capsys, "coverage", "--status", "fine")
    assert code == 2 and "unknown status 'fine'" in err
    code, _, err = run(capsys, "coverage", "--torch-version", "1.13.1")
    assert code == 2 and "no knowledge-base entry for torch 1.13.1" in err


def test_diff_lists_kernel_and_status_changes_apart(capsys):
    data = _json(capsys, "--diff", "2.13.0", "2.14.1")
    kernel = {(c["op"], c["overload"]): (c["from"], c["to"]) for c in data["kernel_changes"]}
    status = {(c["op"], c["overload"]): (c["from"], c["to"]) for c in data["status_changes"]}
    assert kernel[("aten::_ctc_loss", "default")] == ("none", "mps")
    assert status[("aten::_ctc_loss", "default")] == ("unsupported", "native")
    assert kernel[("aten::linalg_svd", "default")] == ("cpu_fallback", "composite")  # left the always-CPU list
    assert kernel[("aten::cholesky", "default")] == ("mps", "absent")  # torch.cholesky left the yaml in 2.14
    lu = _json(capsys, "--diff", "2.9.0", "2.10.0", "--op", "aten::linalg_lu_factor")
    lu_kernel = {(c["op"], c["overload"]): (c["from"], c["to"]) for c in lu["kernel_changes"]}
    lu_status = {(c["op"], c["overload"]): (c["from"], c["to"]) for c in lu["status_changes"]}
    assert lu_kernel[("aten::linalg_lu_factor", "default")] == ("mps", "composite")  # became CIA, and its
    assert ("aten::linalg_lu_factor", "default") not in lu_status  # recorded callees keep it native:
    lu_row = {r.op: r for r in coverage("2.10.0", with_since=False).rows}[K("aten::linalg_lu_factor")]
    assert lu_row.evidence.rule == "composite-samples" and "linalg_lu_factor_ex" in lu_row.evidence.text
    group = _json(capsys, "--diff", "2.12.0", "2.13.0", "--op", "native_group_norm*")
    assert [(c["overload"], c["from"], c["to"]) for c in group["kernel_changes"]] == [
        ("default", "python", "mps"), ("default", "python", "mps")]  # native_group_norm, ..._backward
    assert group["status_changes"] == []  # native in both: Python decomposition, then an MPS kernel
    code, out, _ = run(capsys, "coverage", "--diff", "2.13.0", "2.14.1", "--op", "_ctc_loss*")
    lines = out.splitlines()
    assert code == 0 and lines[1:3] == ["kernel changes: 4", "  aten::_ctc_loss.Tensor: none -> mps"]
    # the autogen'd .out overload keeps its composite kernel; its status follows _ctc_loss's
    status = lines[lines.index("status changes: 7"):]
    assert "  aten::_ctc_loss.out: unsupported -> native (composite-callees)" in status


def test_coverage_help_and_run_never_import_torch():
    code = ("import sys; from opscan.cli import main; main(['coverage', '--torch-version', '2.5.0', '--no-since', "
            "'--op', 'linear']); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "opscan", "coverage", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--diff A B" in done.stdout
    done = subprocess.run([sys.executable, "-m", "opscan", "--help"], capture_output=True, text=True)
    assert "opscan coverage" in done.stdout and "--torch-version" in done.stdout


# --- what-if scans -------------------------------------------------------------------------------


def _rows(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for row in report.rows:
        out.setdefault(row.op.name, []).append(row)
    return out


def test_ctc_loss_is_unsupported_in_2_13_and_native_in_2_14_1(tmp_path, capsys):
    old = scan(ScanOptions(f"{RELEASES}:ctc", torch_version="2.13.0"))
    ctc = _rows(old)["_ctc_loss"] + _rows(old)["_ctc_loss_backward"]
    assert {r.verdict.value for r in ctc} == {"unsupported"} and {r.since for r in ctc} == {"2.14.0"}
    assert all(r.remedy.startswith("upgrade to torch 2.14.1 (native from 2.14.0)") for r in ctc)
    upgrade = old.upgrade
    assert (upgrade["target"], upgrade["first_native"]) == ("2.14.1", "2.14.0")
    assert old.assumptions["torch_release"] == "2.13.0" and old.assumptions["kb_entry"] == "kb: releases/2.13.0.txt"
    new = scan(ScanOptions(f"{RELEASES}:ctc", torch_version="2.14.1"))
    for report in (old, new):  # a release other than the installed one is a what-if, and says so
        what_if = any(n.startswith("what-if: the step was traced with the installed torch")
                      for n in report.assumptions["notes"])
        assert what_if == (report.assumptions["torch_release"] != INSTALLED)
    assert {r.verdict.value for r in _rows(new)["_ctc_loss"]} == {"native"}
    assert new.lane.name == "mac-first" and new.upgrade["target"] is None
    code, out, _ = run(capsys, f"{RELEASES}:ctc", "--torch-version", "2.13.0", "-o", str(tmp_path))
    assert code == 0 and "Upgrade: torch 2.14.1 makes every row of this step native" in out
    assert json.loads((tmp_path / "report.json").read_text())["upgrade"]["target"] == "2.14.1"


def test_embedding_max_norm_is_cpu_fallback_in_every_release():
    from opscan.predict.history import call_classifier
    from opscan.knowledge.common_mps import parse_macos  # noqa: F401 - the view is judged per release below
    from opscan.mps_view import mps_view
    from opscan.scan import run_trace
    from opscan.target.load import load_target

    target = load_target(f"{RELEASES}:embedding_max_norm", {}, [])
    view = mps_view(run_trace(target, ScanOptions("x"), load_knowledge()))
    renorm = [c for c in view if c.op == K("aten::embedding_renorm_")]
    classify = call_classifier()
    assert renorm
    for release in kb_releases():
        found = classify(renorm[0], load_knowledge(release=release))
        assert (found.verdict.value, found.evidence.rule) == ("cpu_fallback", "always-cpu"), release
    report = scan(ScanOptions(f"{RELEASES}:embedding_max_norm", torch_version="2.0.0"))
    assert _rows(report)["embedding_renorm_"][0].verdict.value == "cpu_fallback"
    assert "no covered release after torch 2.0.0 makes every row native" in report.upgrade["text"]


def test_an_unknown_release_or_macos_is_one_line_and_exit_2(capsys, tmp_path):
    tiny = f"{TARGETS / 'tiny.py'}:build_model"
    code, out, err = run(capsys, tiny, "--torch-version", "1.13.1", "-o", str(tmp_path))
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("opscan: error: no knowledge-base entry for torch 1.13.1 (covered: 2.0.0 … 2.14.1)")
    code, _, err = run(capsys, tiny, "--macos", "sonoma", "-o", str(tmp_path))
    assert code == 2 and "not a macOS version: 'sonoma'" in err


def test_the_lens_uses_the_predicted_for_release():
    # _scaled_dot_product_attention_math_for_mps first has an MPS kernel in 2.5.0 (test_kb_releases)
    def ops(release):
        report = scan(ScanOptions(f"{RELEASES}:attention", inference=True, torch_version=release))
        return {row.op.name for row in report.rows}

    assert "_scaled_dot_product_attention_math_for_mps" in ops("2.5.0")
    assert "_scaled_dot_product_attention_math_for_mps" not in ops("2.4.0")


def test_macos_flag_changes_gated_facts():
    kb14, kb15 = load_knowledge(release="2.14.1"), load_knowledge(release="2.14.1", macos="15.0")
    from opscan.predict.rules import predict_op

    op = K("aten::linalg_matrix_exp")  # common_mps.py 2.14.1: MACOS_BEFORE_15_0_XFAILLIST = {"matrix_exp": None}
    assert predict_op(op, ("float32",), kb14).evidence.rule == "macos-gate"
    assert predict_op(op, ("float32",), kb15).verdict.value == "native"
    report = scan(ScanOptions(f"{TARGETS / 'tiny.py'}:build_model", macos="15.0"))
    assert (report.assumptions["macos"], report.assumptions["macos_source"]) == ("15.0", "--macos")


# --- composites decided by what they call (composites.txt) -----------------------------------------


def test_composites_are_decided_by_their_recorded_callees():
    new, old = coverage("2.14.1", with_since=False), coverage("2.5.0", with_since=False)
    rows = {r.op: r for r in new.rows}
    old_rows = {r.op: r for r in old.rows}
    # kthvalue is CompositeExplicitAutograd: its kernel calls kthvalue.values, which has an MPS kernel from
    # 2.9.0 on (releases/2.9.0.txt) and none in 2.5.0
    kth = K("aten::kthvalue")
    assert (rows[kth].status.value, rows[kth].evidence.rule) == ("native", "composite-samples")
    assert (old_rows[kth].status.value, old_rows[kth].evidence.rule) == ("unsupported", "composite-samples")
    assert "kthvalue.values" in old_rows[kth].evidence.text and "sample kthvalue#" in old_rows[kth].evidence.text
    # linalg_svd left the always-CPU list in 2.14 (facts.yaml); there it runs _linalg_svd, an MPS kernel
    svd = K("aten::linalg_svd")
    assert rows[svd].status.value == "native" and "_linalg_svd" in rows[svd].evidence.text
    assert coverage("2.13.0", with_since=False).rows  # (2.13: cpu_fallback, always-cpu)
    assert {r.op: r for r in coverage("2.13.0", with_since=False).rows}[svd].status.value == "cpu_fallback"
    vec = K("aten::upsample_nearest3d.vec")  # calls upsample_nearest3d, an MPS kernel (delegate) since 2.8
    assert rows[vec].status.value == "native" and "upsample_nearest3d" in rows[vec].evidence.text


def test_at_most_a_tenth_of_the_overloads_stay_unknown_each_with_its_reason():
    cov = coverage("2.14.1", with_since=False)
    unknown = [r for r in cov.rows if r.status.value == "unknown"]
    assert len(unknown) <= len(cov.rows) // 10, (len(unknown), len(cov.rows))  # 3,116 overloads: at most 311
    assert all(r.evidence.rule != "composite-no-callees" and r.evidence.text for r in unknown)
    reasons = {r.evidence.rule for r in unknown}
    assert "composite-no-sample" in reasons  # "no sample input of PyTorch's OpInfo database … reaches it"


def test_an_older_release_that_lacks_a_callee_says_its_path_is_not_known():
    cov = coverage("2.0.0", with_since=False)
    rows = {r.op: r for r in cov.rows}
    assert K("aten::nonzero_static") not in rows  # 2.0.0's yaml does not declare it
    # the installed torch's combinations calls nonzero_static: 2.0.0's own path is not known
    row = rows[K("aten::combinations")]
    assert (row.status.value, row.evidence.rule) == ("unknown", "composite-path-unknown")
    assert "through nonzero_static, which torch 2.0.0 does not declare" in row.evidence.text
    assert "decomposes it differently, and that path is not known" in row.evidence.text


def test_an_older_release_is_judged_by_what_it_ran_where_the_facts_know_it():
    # facts.yaml earlier_paths: before 2.5 (pytorch/pytorch#131844) the math attention called at::softmax, which
    # dispatches _softmax (an MPS kernel in every 2.x yaml), where the installed torch calls _safe_softmax
    cov = coverage("2.3.0", with_since=False)
    rows = {r.op: r for r in cov.rows}
    assert K("aten::_safe_softmax") not in rows  # 2.3.0's yaml does not declare it (added in 2.5.0)
    row = rows[K("aten::_scaled_dot_product_attention_math")]
    assert (row.status.value, row.evidence.rule) == ("native", "composite-samples")
    assert "_safe_softmax (native)" in row.evidence.text
    kb = load_knowledge(release="2.3.0")
    from opscan.predict.rules import predict_op

    found = predict_op(K("aten::_safe_softmax"), ("float32",), kb)
    assert (found.verdict.value, found.evidence.rule) == ("native", "earlier-path")
    assert "ran aten::_softmax in its place" in found.evidence.text and "#131844" in found.evidence.source
    assert predict_op(K("aten::_safe_softmax"), ("float32",), load_knowledge(release="2.5.0")).evidence.rule \
        != "earlier-path"  # 2.5.0 declares it: its own entry decides


@pytest.mark.parametrize("release", ["2.0.0", "2.3.0", "2.14.1"])
def test_composites_that_branch_on_the_device_are_judged_by_what_mps_runs(release):
    # the OpInfo samples recorded the CPU path (sdpa -> the CPU flash kernel, no MPS kernel: unsupported; lstm and
    # _convolution: no sample) — on MPS they dispatch the math path, _lstm_mps, _mps_convolution (facts.yaml)
    rows = {r.op: r for r in coverage(release, with_since=False).rows}
    for name, runs in (("scaled_dot_product_attention", "_scaled_dot_product_attention_math (native)"),
                       ("lstm.input", "_lstm_mps (native)"), ("_convolution", "_mps_convolution (native)")):
        row = rows[K(f"aten::{name}")]
        assert (row.status.value, row.evidence.rule) == ("native", "mps-device-branch"), (name, row.evidence)
        assert runs in row.evidence.text and "flash" not in row.evidence.text.split("(MPS input")[0]


def test_the_lens_and_the_device_branch_facts_agree():
    # trace/lens.py steers a traced call; facts.yaml tells coverage what the same composite runs on MPS
    from opscan.knowledge.facts import load_facts
    from opscan.trace.lens import BRANCHES

    facts = load_facts().device_branches
    steered = [b for b in BRANCHES if b.op not in ("linear", "max_pool2d", "rms_norm")]  # own kernels / conditional
    assert {b.op for b in steered} == {"scaled_dot_product_attention", "lstm.input"}
    for branch in steered:
        assert branch.kernel in facts[K(f"aten::{branch.op}")].runs, (branch.op, branch.kernel)


def test_rows_of_ops_the_release_does_not_declare_never_decide_the_upgrade():
    from opscan.predict.history import history
    from opscan.verdict import Classification, Evidence, Verdict

    kb = load_knowledge(release="2.3.0")
    # _fused_rms_norm: first declared in 2.8.0 (releases/2.8.0.txt), and no earlier path in facts.yaml
    safe, mm = (K("aten::_fused_rms_norm"), ("float32",)), (K("aten::mm"), ("float32", "float32"))
    rows = {safe: [safe[0]], mm: [mm[0]]}

    def classify(op, k):  # as predict_call answers: an op the release does not declare is unknown there
        return Classification(Verdict.NATIVE if k.yaml.has(op) else Verdict.UNKNOWN, Evidence("r", "t", "s"))

    current = {safe: Verdict.UNKNOWN, mm: Verdict.NATIVE}  # 2.3.0 lacks _fused_rms_norm (added in 2.8)
    since, upgrade = history(rows, classify, kb, current)
    assert since[safe] == "2.8.0" and since[mm] == "2.0.0"
    assert upgrade.target is None and upgrade.blocking == ()
    assert upgrade.text.startswith("every row is native in torch 2.3.0")
    assert "1 row is an op torch 2.3.0 does not declare" in upgrade.text
