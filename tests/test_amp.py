"""Mixed precision as a Mac runs it (opscan/trace/amp.py, amp_kernels.py, branches.py's GradScaler row, the table
opscan/knowledge/autocast_mps.txt): autocast regions traced under the predicted-for release's AutocastMPS policy,
its gates as findings, GradScaler's MPS path per release, on real and crafted models (tests/targets/amp.py).

What the rows must show, from the table (read from the macOS wheels):
- 2.13.0-2.14.1: linear/matmul/conv lower_precision_fp (float16), layer_norm, the losses, softmax fp32, and
  conv_transpose3d.input fp32 (a rule of its own from 2.9.0; before, it reaches `convolution`'s float16 rule and
  MPS refuses a float16 3-D transposed convolution: kernel_rules.yaml conv-transpose-3d-half);
- before 2.5.0 torch.autocast("mps") raises on a Mac: a `torch::autocast.mps` error row, the region in float32;
- GradScaler.unscale_ on an MPS scale: float32 reciprocal from 2.8.0, float64 (refused by MPS) 2.3.0-2.7.1, and
  no torch.amp.GradScaler before 2.3.0 (a `torch::amp.GradScaler` error row);
- no FFT is in any list: a bfloat16 activation reaches torch.fft.rfft, which refuses it on MPS (fft-half).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from opscan.scan import ScanOptions, scan
from opscan.trace.amp import PORTABLE
from opscan.zoo.releases import result_of, scan_releases

from conftest import REPO, TARGETS

AMP = TARGETS / "amp.py"
_SCANS: dict = {}


def scanned(model: str, release: str = "2.14.1", memory: bool = False, macos: str | None = None, **args):
    """The Report of tests/targets/amp.py:`model` predicted for `release` (cached per test session)."""
    key = (model, release, memory, macos, tuple(sorted(args.items())))
    if key not in _SCANS:
        _SCANS[key] = scan(ScanOptions(f"{AMP}:{model}", args=args, torch_version=release, memory=memory,
                                       fx=False, macos=macos))
    return _SCANS[key]


def rows(report, op: str) -> list:
    return [r for r in report.rows if r.op.display == op]


def floating(report) -> set[str]:
    return {d for r in report.rows for d in r.dtypes if d.startswith(("float", "bfloat"))}


def test_bert_under_portable_float16_autocast_casts_as_mps_2_14_1():
    report = scanned("bert", amp="portable", dtype="float16", scaler=True)
    linears = rows(report, "aten::linear")
    assert linears and all(set(r.dtypes) == {"float16"} for r in linears)  # lower_precision_fp
    assert {r.dtypes for r in rows(report, "aten::native_layer_norm")} == {("float32",) * 3}  # fp32: layer_norm
    assert {r.dtypes for r in rows(report, "aten::nll_loss_forward")} == {("float32", "int64")}  # fp32: nll_loss
    assert {r.dtypes for r in rows(report, "aten::_softmax")} == {("float32",)}
    assert "float16" in {r.dtypes[0] for r in rows(report, "aten::gelu")}  # no rule: runs on what it gets
    assert not any("float64" in r.dtypes for r in report.rows)  # the scaler's unscale_ takes MPS's branch
    assert [r.dtypes for r in rows(report, "aten::reciprocal")] == [("float32",)]
    steered = {e["rule"]: e for e in report.trace["mps_view"]}
    assert "grad_scaler.py" in steered["mps-gradscaler-unscale"]["source"]
    assert any("traced as MPS autocast in float16" in n and "autocast_mps.txt" in n for n in report.trace["notes"])
    assert report.lane.name.value == "mac-first"


def test_the_trace_asks_the_release_what_autocast_does():
    from opscan.knowledge import load_knowledge
    from opscan.predict.calls import amp_of, has_mps_kernel, should_expand
    from opscan.scan import prepare
    from opscan.trace.questions import Questions, answers_equal

    prepared = prepare(ScanOptions(f"{AMP}:mlp", args={"scaler": True}, torch_version="2.14.1", memory=False))
    asked = dict(prepared.trace.asked)
    assert asked[("autocast-mps", "float16")] == "enabled float16"
    assert asked[("autocast-op", "linear")] == "lower_precision_fp"
    assert asked[("autocast-op", "layer_norm")] == "fp32"
    assert asked[("gradscaler-unscale", "unscale_")] == "mps-branch"

    def release(name):
        kb = load_knowledge(release=name)
        return Questions(has_mps_kernel(kb), should_expand(kb), kb.macos, amp_of(kb))
    assert answers_equal(prepared.trace.asked, release("2.13.0"))  # same answers: the same trace serves it
    assert not answers_equal(prepared.trace.asked, release("2.7.1"))  # unscale_ takes the float64 path there


@pytest.mark.parametrize("release, transpose, verdict", [
    ("2.14.1", ("float32",) * 3, "native"),  # conv_transpose3d.input: fp32 (2.9.0+)
    ("2.9.0", ("float32",) * 3, "native"),
    ("2.8.0", ("float16",) * 3, "unsupported_dtype"),  # no rule: convolution's float16, which MPS refuses in 3-D
    ("2.7.1", ("float16",) * 3, "error"),  # no 3-D transposed convolution on MPS at all before 2.8
])
def test_conv_transpose3d_keeps_float32_from_2_9(release, transpose, verdict):
    report = scanned("deconv3d", release, amp="portable")
    (conv,) = rows(report, "aten::_mps_convolution")
    assert conv.dtypes == ("float16",) * 3  # conv3d / convolution: lower_precision_fp in every release with MPS amp
    (deconv,) = rows(report, "aten::_mps_convolution_transpose")
    assert (deconv.dtypes, deconv.verdict.value) == (transpose, verdict)
    if verdict != "native":
        assert deconv.evidence.rule == ("kernel-conv-transpose-3d" if verdict == "error" else
                                        "kernel-conv-transpose-3d-half")


def test_before_2_5_an_mps_autocast_region_is_a_finding():
    report = scanned("mlp", "2.4.0", amp="mps")
    (row,) = rows(report, "torch::autocast.mps")
    assert (row.verdict.value, row.evidence.rule, row.dtypes) == ("error", "amp-api", ())
    assert "raises on a Mac in torch 2.4.0" in row.evidence.text and "2.5.0" in row.evidence.text
    assert "autocast_mps.txt" in row.evidence.source and row.since == "2.5.0"
    assert floating(report) == {"float32"}  # the region traced without autocast
    assert any("raises on a Mac" in n for n in report.trace["notes"])
    assert report.lane.name.value == "linux-gpu-first"
    assert not rows(scanned("mlp", "2.5.0", amp="mps"), "torch::autocast.mps")


def test_the_bfloat16_gates_2_5_and_macos_14():
    report = scanned("mlp", "2.5.0", amp="mps", dtype="bfloat16", macos="14.0")
    assert floating(report) == {"float32"}
    assert any("accepts only float16" in n and "traced without autocast" in n for n in report.trace["notes"])
    below = scanned("mlp", "2.6.0", amp="mps", dtype="bfloat16", macos="13.0")  # 2.6-2.9: a Python check
    assert floating(below) == {"float32"}
    assert any("below macOS 14" in n for n in below.trace["notes"])
    above = scanned("mlp", "2.6.0", amp="mps", dtype="bfloat16", macos="14.0")
    assert {r.dtypes for r in rows(above, "aten::linear")} == {("bfloat16",) * 3}


def test_a_bfloat16_fft_under_mps_autocast_is_an_error_row_not_a_failed_scan():
    report = scanned("spectral", amp="portable", dtype="bfloat16")
    (row,) = rows(report, "aten::fft_rfft")
    assert (row.dtypes, row.verdict.value, row.evidence.rule) == (("bfloat16",), "error", "fft-half")
    assert "Unsupported dtype BFloat16" in row.evidence.text and "SpectralOps.cpp" in row.evidence.source
    assert {r.dtypes for r in rows(report, "aten::linear")} == {("bfloat16",) * 3}
    assert any("refused its float16/bfloat16 input on the tracing CPU" in n for n in report.trace["notes"])


@pytest.mark.parametrize("amp, says", [
    ("cuda", "torch.autocast('cuda') at amp.py:"),
    ("cpu", "torch.autocast('cpu') at amp.py:"),  # a literal "cpu": CPU tensors only on a Mac
])
def test_a_region_for_another_device_is_traced_disabled_with_a_note(amp, says):
    report = scanned("mlp", amp=amp)
    assert floating(report) == {"float32"}
    (note,) = [n for n in report.trace["notes"] if n.startswith(says)]
    assert "traced without autocast" in note and PORTABLE in note


def test_the_portable_spelling_is_read_as_the_steps_device():
    report = scanned("mlp", amp="portable")
    assert {r.dtypes for r in rows(report, "aten::linear")} == {("float16",) * 3}
    assert any("read as autocast on the step's device" in n for n in report.trace["notes"])


@pytest.mark.parametrize("release, float64, finding", [
    ("2.14.1", False, False),  # 2.8.0+: MPS branch, float32 reciprocal
    ("2.7.1", True, False),  # 2.3.0-2.7.1: self._scale.double(): float64 rows MPS refuses
    ("2.2.2", True, True),  # no torch.amp.GradScaler at all
])
def test_gradscaler_unscale_as_each_release_runs_it_on_mps(release, float64, finding):
    report = scanned("mlp", release, amp="portable", scaler=True)
    wide = [r for r in report.rows if "float64" in r.dtypes]
    assert bool(wide) == float64
    assert all(r.verdict.value == "unsupported_dtype" for r in wide)
    scaler = rows(report, "torch::amp.GradScaler")
    assert bool(scaler) == finding
    if finding:
        assert (scaler[0].verdict.value, scaler[0].since) == ("error", "2.3.0")
        assert "does not exist in torch 2.2.2" in scaler[0].evidence.text


def test_one_trace_serves_the_releases_that_answer_the_amp_questions_alike():
    releases = ("2.2.2", "2.3.0", "2.4.0", "2.5.0", "2.7.1", "2.8.0", "2.9.0", "2.13.0", "2.14.1")
    options = ScanOptions(f"{AMP}:mlp", args={"scaler": True}, fx=False)
    new = scan_releases(options, releases)
    old = {r: result_of(scan(replace(options, torch_version=r, memory=False)), r) for r in releases}
    assert new == old
    trace = {r: found.trace for r, found in new.items()}
    assert trace["2.3.0"] == trace["2.4.0"] != trace["2.2.2"]  # autocast raises in all three; no scaler in 2.2
    assert trace["2.4.0"] != trace["2.5.0"] != trace["2.8.0"]
    assert trace["2.9.0"] == trace["2.13.0"] == trace["2.14.1"]  # linear, layer_norm: the same rules


def test_memory_and_its_sizing_runs_follow_the_autocast_dtypes():
    on = scanned("mlp", memory=True, amp="portable", batch=2048).memory
    off = scanned("mlp", memory=True, amp="cuda", batch=2048).memory
    assert on["batch_scaling"]["method"] == off["batch_scaling"]["method"] == "meta"
    active = [m["estimate"]["phases"]["forward"]["categories"]["activations"] for m in (on, off)]
    sized = [[p["peak_bytes"] for p in m["batch_scaling"]["points"]] for m in (on, off)]
    assert active[0] != active[1]  # float16 linears, float32 copies for layer_norm: other storages
    assert sized[0] != sized[1]  # the meta sizing runs cast too (meta tensors meet the autocast kernels)
    assert (active[0] > active[1]) == all(a > b for a, b in zip(*sized))


def test_examples_custom_step_is_written_portably_and_traced_as_mps_autocast():
    report = scan(ScanOptions(str(REPO / "examples" / "custom_step.py") + ":build_model", memory=False))
    assert {r.dtypes for r in rows(report, "aten::linear")} == {("bfloat16",) * 3}
    assert {r.dtypes for r in rows(report, "aten::native_layer_norm")} == {("float32",) * 3}
    assert report.lane.name.value == "mac-first"
    source = (REPO / "examples" / "custom_step.py").read_text(encoding="utf-8")
    assert 'torch.autocast("cpu"' not in source and "device_type=features.device.type" in source


def test_torch_is_left_as_it_was_after_a_trace():
    import torch
    from torch.amp.autocast_mode import autocast

    scanned("spectral", amp="portable", dtype="bfloat16")
    assert autocast.__init__.__module__ == autocast.__exit__.__module__ == "torch.amp.autocast_mode"
    assert torch.amp.GradScaler.unscale_.__module__ == "torch.amp.grad_scaler"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # torch's own CPU policy again: the FFT is cast to float32
        assert torch.fft.rfft(torch.randn(8, dtype=torch.bfloat16)).dtype == torch.complex64
