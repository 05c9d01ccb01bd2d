"""The step as the user's own code places it on a Mac (issue 33): host tensors from each source, the verdicts their
MPS kernels give them (knowledge/placement.yaml), one finding per host tensor at its line, and a lane that placement
findings do not decide. Crafted steps in tests/targets/placement*.py; each test names the rule and its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opscan.knowledge import load_knowledge
from opscan.knowledge.placement import load_placement, parse_placement, parse_ti
from opscan.mps_view import MpsCall
from opscan.opkey import OpKey
from opscan.predict.calls import predict_call
from opscan.scan import ScanOptions, scan
from opscan.trace.records import TensorMeta
from opscan.verdict import Verdict

TARGETS = Path(__file__).parent / "targets"


def _scan(name: str, factory: str = "build", release: str | None = None):
    spec = f"{TARGETS / name}:{factory}"
    return scan(ScanOptions(spec, memory=False, torch_version=release))


def _rows(report, op: str):
    return [r for r in report.rows if r.op.display == op]


def _row(report, op: str):
    found = _rows(report, op)
    assert found, f"no row {op}: {[r.op.display for r in report.rows]}"
    return max(found, key=lambda r: r.verdict.rank)


def _placed(report):
    """The report's placement findings: one per host tensor, at the line that made it (report/findings.py)."""
    return [f for f in report.findings if f.rule.startswith("placement-")]


def _origins(report) -> list[tuple[str, str | None, int | None]]:
    return [(f.origin["kind"], f.origin["name"], f.site["line"]) for f in _placed(report)]


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# --- one crafted step per host source -------------------------------------------------------------------------

def test_a_factory_without_device_feeding_an_embedding_is_an_error_at_its_line():
    report = _scan("placement.py", "embed")
    row = _row(report, "aten::index_select")  # nn.Embedding -> embedding's composite -> index_select
    assert row.verdict == Verdict.ERROR and row.evidence.rule == "placement-index-select"
    assert "Indexing.mm" in row.evidence.source
    assert row.placement["hardware_verdict"] == "native"
    line = _line(TARGETS / "placement.py", "else torch.arange(x.size(1))")
    assert ("factory", "torch.arange", line) in _origins(report)
    assert report.lane.name == "mac-first"  # the placement error does not decide the lane ...
    assert report.lane.why[0].kind == "placement" and "1 placement fix" in report.lane.why[0].text  # ... it is said


def test_a_factory_tensor_in_an_elementwise_op_is_an_error_and_a_0_dim_one_is_taken():
    report = _scan("placement.py", "scale")
    mul = _row(report, "aten::mul.Tensor")
    assert mul.verdict == Verdict.ERROR and mul.evidence.rule == "placement-binary-cpu-scalar"
    assert "TensorIterator.cpp" in mul.evidence.source and "found at least two devices" in mul.evidence.text
    kinds = _origins(report)
    assert [k for k in kinds if k[1] == "torch.ones"] and not [k for k in kinds if k[1] == "torch.tensor"]


def test_a_module_level_loss_target_is_an_error_of_nll_loss():
    report = _scan("placement_loss.py")
    for op in ("aten::nll_loss_forward", "aten::nll_loss_backward"):
        row = _row(report, op)
        assert row.verdict == Verdict.ERROR and row.evidence.rule == "placement-loss-target"
        assert "LossOps.mm" in row.evidence.source and "Placeholder" in row.evidence.text
    line = _line(TARGETS / "placement_loss.py", "TARGETS = torch.tensor")
    assert _origins(report) == [("global", "TARGETS", line)]
    finding = _placed(report)[0]  # one finding for both rows: one host tensor
    assert finding.site["text"] == "TARGETS = torch.tensor([3, 1])" and finding.verdict == Verdict.ERROR
    assert finding.ops == ("aten::nll_loss_forward", "aten::nll_loss_backward")
    assert [m["line"] for m in finding.met] == [_line(TARGETS / "placement_loss.py", "F.cross_entropy")]
    assert report.lane.name == "mac-first" and len(report.findings) == 1


def test_a_plain_tensor_attribute_is_an_error_of_masked_fill_at_its_assignment():
    report = _scan("placement.py", "masked")
    row = _row(report, "aten::masked_fill_.Scalar")
    assert row.verdict == Verdict.ERROR and row.evidence.rule == "placement-masked-fill-mask"
    assert "kc-1e68f5a6" in row.evidence.source
    assert _origins(report) == [("attribute", "Masked.mask", _line(TARGETS / "placement.py", "self.mask = mask"))]
    assert "register_buffer" in _placed(report)[0].fix


def test_a_closed_over_tensor_is_a_host_source_of_its_own():
    report = _scan("placement_closure.py")
    assert _row(report, "aten::mul.Tensor").verdict == Verdict.ERROR
    assert [o[:2] for o in _origins(report)] == [("closure", "weights")]


def test_from_numpy_in_the_step_is_a_tensor_made_outside_the_dispatcher():
    report = _scan("placement.py", "from_numpy")
    assert _row(report, "aten::mul.Tensor").verdict == Verdict.ERROR
    finding = _placed(report)[0]
    assert finding.origin["kind"] == "before-step" and finding.origin["first_read"]  # named by the line that read it
    assert finding.site["line"] == _line(TARGETS / "placement.py", "torch.from_numpy(np.ones")


def test_a_dataloader_batch_the_step_does_not_move_reaches_linear():
    report = _scan("placement_loader.py")
    assert _row(report, "aten::linear").evidence.rule == "placement-linear"  # Linear.mm checks input's device
    assert _row(report, "aten::nll_loss_forward").verdict == Verdict.ERROR
    assert {o[0] for o in _origins(report)} == {"before-step"}


def test_a_batch_the_step_moves_with_to_device_is_on_the_device():
    report = _scan("placement_loader_moved.py")
    assert not _placed(report)
    assert all(r.placement is None for r in report.rows) and report.lane.name == "mac-first"
    # the move is the copy a Mac makes: a host -> device copy of each batch tensor (_to_copy's callee copy_)
    assert _rows(report, "aten::copy_")


def test_what_is_computed_only_from_host_tensors_runs_on_the_cpu_and_keeps_the_origin():
    report = _scan("placement.py", "derived")
    gt = _row(report, "aten::gt.Scalar")
    assert gt.verdict == Verdict.NATIVE and gt.evidence.rule == "placement-host"
    assert _row(report, "aten::masked_fill_.Scalar").verdict == Verdict.ERROR
    assert [o[:2] for o in _origins(report)] == [("factory", "torch.rand")]  # the fill's mask came from it


def test_what_cpu_returns_stays_on_the_host_and_float64_math_on_it_runs_on_the_cpu():
    report = _scan("placement.py", "host_metrics")
    for op in ("aten::_softmax", "aten::log", "aten::mean.dim"):  # float64 on the host: the CPU's kernels
        row = _row(report, op)
        assert row.dtypes[0] == "float64" and row.verdict == Verdict.NATIVE and row.evidence.rule == "placement-host"
    assert not _placed(report) and report.lane.name == "mac-first"
    assert all(r.verdict == Verdict.NATIVE for r in report.rows)


def test_a_host_copy_handed_back_to_a_device_op_is_an_error_at_the_move():
    report = _scan("placement.py", "host_copy_back")
    div = _row(report, "aten::div.Tensor")
    assert div.verdict == Verdict.ERROR and div.evidence.rule.startswith("placement-")
    line = _line(TARGETS / "placement.py", '.amax(0).to("cpu")')
    assert ("to-host", ".to('cpu')", line) in _origins(report)
    fixed = _scan("placement.py", "host_copy_back_fixed")
    assert not _placed(fixed) and all(r.verdict == Verdict.NATIVE for r in fixed.rows)


def test_numpy_float64_cast_to_float32_while_moving_never_exists_on_mps():
    report = _scan("placement.py", "from_array")
    assert not _placed(report) and report.lane.name == "mac-first"
    assert all(r.verdict == Verdict.NATIVE for r in report.rows), [(r.op.display, r.dtypes, r.verdict) for r in
                                                                   report.rows if r.verdict != Verdict.NATIVE]
    cast = _row(report, "aten::copy_")
    assert any(r.dtypes == ("float32", "float64") and r.evidence.rule == "placement-cast-on-host"
               for r in _rows(report, "aten::copy_")), cast
    moves = report.transfers["implicit"]  # the three moves to the device, once each; the host-side casts move nothing
    assert moves["calls"] == moves["h2d_syncs"] == 3 and moves["d2h_bytes"] == 0


def test_numpy_float64_moved_without_a_dtype_is_float64_on_mps():
    report = _scan("placement.py", "from_array_float64")
    assert any(r.dtypes == ("float64", "float64") and r.verdict == Verdict.UNSUPPORTED_DTYPE
               for r in _rows(report, "aten::copy_"))
    assert report.lane.name != "mac-first"


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])  # a FakeTensor's device is a Python property
def test_a_device_read_from_a_host_tensor_names_the_host(fake):
    def scan_it(factory):
        return scan(ScanOptions(f"{TARGETS / 'placement.py'}:{factory}", memory=False, fake=fake))
    report = scan_it("host_device_of")  # timm's DINOv3 RoPE: device=coords.device, coords on the CPU
    assert not _placed(report) and report.lane.name == "mac-first"
    assert _row(report, "aten::mul.Tensor").evidence.rule == "placement-host"
    wrong = scan_it("host_device_of_wrong")  # device=x.device: the factor is on MPS, coords are not
    assert _row(wrong, "aten::mul.Tensor").verdict == Verdict.ERROR
    assert [o[:2] for o in _origins(wrong)] == [("factory", "torch.linspace")]


@pytest.mark.parametrize("name", ["embed_fixed", "scale_fixed", "masked_fixed"])
def test_the_fixed_steps_have_no_placement_finding(name):
    report = _scan("placement.py", name)
    assert not _placed(report) and report.lane.name == "mac-first"
    assert all(r.verdict == Verdict.NATIVE for r in report.rows)


def test_a_target_moved_where_the_loss_uses_it_has_no_finding():
    report = _scan("placement_loss_fixed.py")
    assert not _placed(report) and all(r.verdict == Verdict.NATIVE for r in report.rows)


def test_the_device_tensors_hook_tells_opscan_the_users_script_moves_a_tensor():
    report = _scan("placement_told.py")
    assert not _placed(report) and all(r.verdict == Verdict.NATIVE for r in report.rows)


# --- the exceptions, each with its source -----------------------------------------------------------------------

def test_cpu_indices_a_0_dim_put_value_and_0_dim_where_operands_are_taken():
    report = _scan("placement.py", "exceptions")
    assert not _placed(report), _placed(report)
    assert _row(report, "aten::index.Tensor").verdict == Verdict.NATIVE
    assert _row(report, "aten::where.self").verdict == Verdict.NATIVE


def test_where_with_a_0_dim_cpu_operand_is_not_established_before_2_3():
    report = _scan("placement.py", "exceptions", release="2.2.0")
    where = _row(report, "aten::where.self")
    assert where.verdict == Verdict.UNKNOWN and where.evidence.rule == "placement-unknown"
    assert "where-mps-out" in where.evidence.text and "kc-00947f1d" in where.evidence.source
    assert report.lane.name == "mac-first"  # unknown placement rows do not decide the lane either


def test_a_0_dim_cpu_tensor_to_an_mpsgraph_kernel_raises():
    report = _scan("placement.py", "target_0d")
    row = _row(report, "aten::nll_loss_forward")
    assert row.verdict == Verdict.ERROR and "0-dim" in row.evidence.text


def _meta(shape, host=False, dtype="float32", source=1):
    stride = tuple(1 for _ in shape)
    return TensorMeta(dtype, tuple(shape), stride, "cpu", source, 4, host=host, host_from=(source,) if host else ())


def _predict(op: str, inputs, release: str = "2.14.1", outputs=None, rule=None):
    kb = load_knowledge(release=release)
    call = MpsCall(0, OpKey.from_yaml(op), "forward", "", tuple(inputs), tuple(outputs or [_meta((4,), source=9)]),
                   tuple(t.dtype for t in inputs), rule=rule)
    return predict_call(call, kb, {})


def test_at_most_one_cpu_scalar_in_a_binary_op():
    one = _predict("add.out", [_meta((), host=True), _meta((4,), source=2)])
    assert one.verdict == Verdict.NATIVE
    two = _predict("maximum.out", [_meta((), host=True), _meta((), host=True, source=3), _meta((4,), source=4)])
    assert two.verdict == Verdict.ERROR and "Trying to pass too many CPU scalars" in two.evidence.text


def test_index_put_takes_cpu_indices_and_a_0_dim_value_but_not_a_cpu_tensor_value():
    self_, idx = _meta((4,), source=2), _meta((2,), host=True, dtype="int64")
    taken = _predict("_index_put_impl_", [self_, idx, _meta((), host=True, source=3)])
    assert taken.verdict == Verdict.NATIVE
    refused = _predict("_index_put_impl_", [self_, idx, _meta((2,), host=True, source=3)])
    assert refused.verdict == Verdict.ERROR and refused.evidence.rule == "placement-index-put"
    assert "_index_put_impl_" in refused.evidence.source


def test_a_cpu_indexed_tensor_with_device_indices_is_refused():
    found = _predict("index.Tensor", [_meta((4,), host=True), _meta((2,), dtype="int64", source=2)])
    assert found.verdict == Verdict.ERROR and "indices should be either on cpu" in found.evidence.text


def test_copies_take_any_cpu_tensor():
    found = _predict("copy_", [_meta((4,), source=2), _meta((4,), host=True)], rule="mps-copy")  # as mps_view marks it
    assert found.verdict == Verdict.NATIVE and found.evidence.rule == "mps-copy"
    moved = _predict("_to_copy", [_meta((4,), host=True)], outputs=[_meta((4,), source=5)])
    assert not moved.evidence.rule.startswith("placement-")  # judged as any composite is, never refused


def test_an_op_no_rule_names_is_unknown_with_the_reason():
    found = _predict("_cdist_forward", [_meta((4, 3), source=2), _meta((4, 3), host=True)])
    assert found.verdict == Verdict.UNKNOWN and "not established" in found.evidence.text
    assert "torchgen generates one for CUDA and XPU only" in found.evidence.text


def test_linear_before_the_release_whose_kernel_checks_devices_is_unknown():
    args = [_meta((2, 4), host=True), _meta((3, 4), source=2)]
    assert _predict("linear", args, "2.4.0").verdict == Verdict.ERROR
    assert _predict("linear", args, "2.3.0").verdict == Verdict.UNKNOWN


def test_a_tensor_iterator_op_counts_where_the_release_has_it_structured():
    args = [_meta((4,), host=True), _meta((4,), source=2)]
    found = _predict("hypot", args)  # hypot -> hypot.out, structured_inherits: TensorIteratorBase
    assert found.verdict == Verdict.ERROR and found.evidence.rule == "placement-tensor-iterator"
    zero = _predict("hypot", [_meta((), host=True), _meta((4,), source=2)])
    assert zero.verdict == Verdict.UNKNOWN  # whether hypot's config allows a CPU scalar is not established here


def test_an_all_host_call_runs_on_the_cpu_whatever_mps_says():
    found = _predict("add.Tensor", [_meta((4,), host=True, dtype="float64"), _meta((4,), host=True, dtype="float64")],
                     outputs=[_meta((4,), host=True, dtype="float64")])
    assert found.verdict == Verdict.NATIVE and found.evidence.rule == "placement-host"  # float64 on the CPU is fine


# --- the knowledge ------------------------------------------------------------------------------------------------

def test_every_rule_has_a_source_and_the_table_is_the_installed_yaml():
    rules = load_placement()
    assert rules and all(r.source and (r.path is not None or dict(r.takes) == {"all": "any"}) for r in rules)
    line, ops = parse_ti((Path(__file__).parents[1] / "opscan/knowledge/placement_ti.txt").read_text())
    assert line.startswith("release ") and {"add.out", "hypot.out", "index.Tensor_out"} <= ops


@pytest.mark.parametrize("bad, fixes", [
    ({"id": "x", "ops": ["add.Tensor"], "first": "2.0", "source": "s", "takes": {"all": "sometimes"}}, "one of"),
    ({"id": "x", "ops": ["add.Tensor"], "first": "2.0", "source": "s", "path": "nowhere"}, "unknown path"),
    ({"id": "x", "ops": ["add.Tensor"], "first": "2.0", "source": "s"}, "names no path"),
    ({"id": "x", "first": "2.0", "source": "s", "path": "check"}, "bad set of keys"),
])
def test_a_malformed_rule_is_refused(bad, fixes):
    text = json.dumps({"paths": {"check": {"text": "t"}}, "rules": [bad]})
    with pytest.raises(ValueError, match=fixes):
        parse_placement(text)


# --- one mode, the checks, the repro and memory stages ------------------------------------------------------------

def test_the_trace_runs_one_torch_function_mode():
    from tests.targets import placement as crafted

    crafted.MODES_SEEN.clear()
    _scan("placement.py", "mode_counter")
    assert crafted.MODES_SEEN and set(crafted.MODES_SEEN) == {1}  # five before issue 37's one-mode change


def _summary(tmp_path, rows: list[dict], *flags: str) -> tuple[int, str]:
    import subprocess
    import sys

    doc = {"measurement": {"environment": {"off": {}}, "device": "cuda", "stands_for_mps": False, "probes": 1,
                           "calls": 1, "outcomes": {"native": 1}, "shapes": "full"}, "ops": rows}
    target = tmp_path / "report.json"
    target.write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "bench" / "probe_summary.py"), *flags,
                           str(target)], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout


def _measured_row(predicted: str, measured: str) -> dict:
    return {"op": "aten::nll_loss_forward", "overload": "default", "dtypes": ["float32", "int64"],
            "verdict": predicted, "measured": {"verdict": measured, "off": {"message": "target is on cpu"}}}


def test_probe_summary_fails_on_a_measured_error_the_prediction_lacks(tmp_path):
    code, out = _summary(tmp_path, [_measured_row("native", "error")])
    assert code == 1 and "measured error, not predicted: aten::nll_loss_forward" in out
    assert _summary(tmp_path, [_measured_row("error", "error")])[0] == 0  # predicted: fine ...
    code, out = _summary(tmp_path, [_measured_row("error", "error")], "--no-errors")  # ... unless it must run clean
    assert code == 1 and "must run clean" in out
    assert _summary(tmp_path, [_measured_row("native", "native")], "--no-errors")[0] == 0


def test_no_upstream_repro_is_written_for_a_placement_finding():
    from opscan.repro.section import is_finding

    report = _scan("placement_loss.py")
    placed = [r for r in report.rows if r.placement is not None]
    assert placed and not any(is_finding(r) for r in placed)


def test_the_memory_stage_names_the_host_tensors_that_stop_its_sizing_runs():
    report = scan(ScanOptions(f"{TARGETS / 'placement.py'}:masked"))
    line = report.memory["batch_line"]
    assert "not sized" in line and "Masked.mask" in line and "placement findings" in line


def test_a_composite_that_moves_its_cpu_arguments_itself_is_no_finding():
    # LossCTC.cpp moves the targets to the log-probabilities' device and reads the lengths on the CPU
    report = _scan("placement.py", "ctc")
    assert not _placed(report), _placed(report)
    assert _row(report, "aten::_ctc_loss.Tensor").verdict == Verdict.NATIVE


def test_a_python_scalar_written_into_a_device_tensor_is_on_the_device():
    report = _scan("placement.py", "set_item")
    assert not _placed(report) and all(r.verdict == Verdict.NATIVE for r in report.rows)


def test_a_host_computation_through_composites_then_moved_is_no_finding():
    report = _scan("placement.py", "host_then_moved")
    assert not _placed(report), _placed(report)
    assert _row(report, "aten::abs.out").evidence.rule == "placement-host"  # its result allocated on the host too


def test_the_console_and_json_show_one_finding_per_host_tensor():
    from opscan.render.console import render_table

    report = scan(ScanOptions(str(Path(__file__).parents[1] / "examples" / "host_tensor.py") + ":build_model",
                              memory=False))
    text = render_table(report, width=200)
    assert "Lane (predicted): mac-first — once the 3 placement fixes are made" in text
    assert "Findings: 3 causes" in text and "Placement:" not in text  # listed once, as findings
    assert "[3] examples/host_tensor.py:21 in <module>: error" in text
    assert "why: module-level tensor CLASS_WEIGHTS: model.to(device) leaves it on the CPU" in text
    assert "met MPS kernels at: host_tensor.py:52 in loss_fn (loss, backward)" in text
    doc = json.loads(report.to_json())
    assert "placement" not in doc  # the findings carry what the placement section held
    found = doc["findings"]
    assert {f["origin"]["name"] for f in found} == {"torch.arange", "TinyTagger.causal", "CLASS_WEIGHTS"}
    assert [f["site"]["line"] for f in found] == [37, 33, 21]  # each at the line that made the tensor
    assert all(f["met"] and f["fix"] and f["upstream"]["kind"] == "user-code" for f in found)
    from opscan.cli.common import exit_code

    assert exit_code(report, "error") == 1 and exit_code(report, None) == 0  # --fail-on error fails on them


def test_every_kernel_check_a_rule_cites_is_in_kernel_checks():
    import re

    knowledge = Path(__file__).parents[1] / "opscan" / "knowledge"
    cited = set(re.findall(r"kc-[0-9a-f]{8}", (knowledge / "placement.yaml").read_text()))
    known = {line.split("\t", 1)[0] for line in (knowledge / "kernel_checks.txt").read_text().splitlines()}
    assert cited and cited <= known, cited - known
