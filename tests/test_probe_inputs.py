"""Measured mode, in-process: probe inputs (seeded floats, recorded and built integers, strides), the
op_probes registry, shape caps, the journal, the progress bar, and measurements in the report."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
import torch

import op_probes
from opscan.probe import replay
from opscan.probe.backends import Backend
from opscan.probe.calls import make
from opscan.probe.journal import Journal, JournalError, read_journal
from opscan.probe.progress import bar_text
from opscan.probe.protocol import PassOutcome, TensorSpec
from opscan.probe.shrink import apply, cap, numel
from opscan.probe.worker import run_one
from opscan.render import render_table
from opscan.graph.lanes import decide_lane
from opscan.report import disagreements, measured_rows
from opscan.verdict import Source
from opscan.verdict import Evidence, Verdict

from helpers_report import report
from test_schema import load_schema


def _build(op, tensors, args, kwargs=None):
    call = make(op, tensors, {"args": args, "kwargs": kwargs or {}})
    func = replay.resolve(op)
    return call, func, replay.build(call, func)


def test_floats_are_seeded_and_keep_recorded_strides_even_when_expanded():
    spec = TensorSpec("float32", (3, 4), (0, 1))  # an expanded row: every row is the same storage
    call, func, tensors = _build("aten::relu", [spec], [{"t": 0}])
    again = replay.build(call, func)
    assert torch.equal(tensors[0], again[0]) and tensors[0].stride() == (0, 1)
    args, _ = replay.materialize(call, tensors, "cpu", wide=True)
    assert args[0].dtype == torch.float64 and args[0].stride() == (0, 1)
    assert torch.equal(args[0].float(), tensors[0])  # the reference sees the probe's own values


def test_recorded_integer_values_are_used_and_missing_ones_are_built_in_range():
    weight, ids = TensorSpec("float32", (10, 4), (4, 1)), TensorSpec("int64", (2, 3), (3, 1))
    _, _, recorded = _build("aten::embedding", [weight, TensorSpec("int64", (2,), (1,), [7, 9])], [{"t": 0}, {"t": 1}])
    assert recorded[1].tolist() == [7, 9]
    _, _, built = _build("aten::embedding", [weight, ids], [{"t": 0}, {"t": 1}])
    assert built[1].shape == (2, 3) and 0 <= int(built[1].min()) and int(built[1].max()) < 10


def test_builders_make_valid_inputs_for_pooling_backward_and_cholesky():
    grad, x, idx = (TensorSpec("float32", (1, 1, 2, 2), (4, 4, 2, 1)), TensorSpec("float32", (1, 1, 4, 4), (16, 16, 4, 1)),
                    TensorSpec("int64", (1, 1, 2, 2), (4, 4, 2, 1)))
    _, _, tensors = _build("aten::max_pool2d_with_indices_backward", [grad, x, idx],
                           [{"t": 0}, {"t": 1}, [2, 2], [2, 2], [0, 0], [1, 1], False, {"t": 2}])
    assert torch.equal(tensors[2], torch.ops.aten.max_pool2d_with_indices(tensors[1], [2, 2], [2, 2])[1])
    call, func, tensors = _build("aten::linalg_cholesky_ex", [TensorSpec("float32", (3, 3), (3, 1))], [{"t": 0}])
    assert int(func(*replay.materialize(call, tensors, "cpu", wide=False)[0])[1]) == 0  # info 0: positive definite


def test_inputs_that_cannot_be_built_say_why():
    with pytest.raises(replay.BuildError, match="no values were recorded for index"):
        _build("aten::take", [TensorSpec("float32", (5,), (1,)), TensorSpec("int64", (3,), (1,))],
               [{"t": 0}, {"t": 1}])
    with pytest.raises(replay.BuildError, match="not registered in the probe process"):
        replay.resolve("nowhere::custom_op")  # e.g. a torch.library op defined by the target file
    call, _, tensors = _build("aten::relu", [TensorSpec("float32", (2,), (1,))], [{"t": 0}],
                              {"group": {"unsupported": "ProcessGroup"}})
    with pytest.raises(replay.BuildError, match="ProcessGroup"):
        replay.materialize(call, tensors, "cpu", False)


@pytest.mark.parametrize("argument, why", [
    ({"dtype": "float8_e9m9"}, "has no dtype float8_e9m9"),  # a dtype the measuring torch lacks
    ({"memory_format": "tiled_format"}, "has no memory_format tiled_format"),
    ({"symint_node": 3}, "an argument of type symint_node cannot be replayed"),  # a tag this opscan does not know
])
def test_an_argument_this_torch_cannot_rebuild_is_unbuildable_never_the_op_raising(argument, why):
    # the worker's decoder once raised AttributeError / KeyError here, which the device pass then measured as the
    # op raising (an `error` row); the repro script's copy said "cannot run here". Both now run rebuild.decode_argument:
    # BuildError, an unbuildable outcome (an `unknown` row) in the probe and exit 2 in a script.
    call, _, tensors = _build("aten::relu", [TensorSpec("float32", (2,), (1,))], [{"t": 0}], {"extra": argument})
    with pytest.raises(replay.BuildError, match=why):
        replay.materialize(call, tensors, "cpu", False)
    outcome = run_one(call, "off", Backend())
    assert (outcome.status, outcome.exc_type) == ("unbuildable", "BuildError") and why in outcome.message


def test_integers_that_index_nothing_get_small_values_without_a_builder():
    _, _, tensors = _build("aten::bitwise_and.Tensor", [TensorSpec("int64", (4,), (1,))] * 2, [{"t": 0}, {"t": 1}])
    assert all(0 <= int(t.min()) and int(t.max()) < 4 for t in tensors)
    _, _, tensors = _build("aten::view", [TensorSpec("bool", (2, 3), (3, 1))], [{"t": 0}, [6]])  # data movement
    assert tensors[0].dtype == torch.bool


def test_the_builder_registry_fails_fast():
    assert "aten::embedding" in op_probes.builders()
    with pytest.raises(op_probes.RegistryError, match="already has a probe builder"):
        op_probes.register("aten::embedding")(lambda ctx: None)
    with pytest.raises(op_probes.RegistryError, match="no such operator overload"):
        op_probes.register("aten::embedding.nope")(lambda ctx: None)


CONV = make("aten::convolution", [TensorSpec("float32", (2, 64, 32, 32), (65536, 1024, 32, 1)),
                                  TensorSpec("float32", (64, 64, 3, 3), (576, 9, 3, 1))],
            {"args": [{"t": 0}, {"t": 1}, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], "kwargs": {}})


def test_shapes_are_capped_consistently_and_checked_on_meta():
    proposed = cap(CONV, 4096, lambda op: False)
    assert proposed.tensors == CONV.tensors and proposed.shrink  # the worker applies it
    capped = apply(proposed)
    assert max(numel(t.shape) for t in capped.tensors) <= 4096
    assert capped.tensors[1].shape[2:] == (3, 3) and capped.tensors[0].shape[1] == capped.tensors[1].shape[1]
    assert capped.note.startswith("shapes capped from") and capped.id == CONV.id
    assert cap(CONV, 0, lambda op: False) is CONV  # full shapes


def test_a_call_that_breaks_when_capped_keeps_its_full_shapes():
    view = make("aten::view", [TensorSpec("float32", (64, 64), (64, 1))], {"args": [{"t": 0}, [4096]], "kwargs": {}})
    kept = cap(view, 1024, lambda op: False)
    assert kept.shrink is None and kept.note.startswith("full shapes: the capped call fails on meta")


def _outcome(pid, pass_name="off"):
    return PassOutcome(pid, pass_name, "ran", duration=0.1)


def test_the_journal_resumes_past_a_torn_line_and_refuses_another_plan(tmp_path):
    path = tmp_path / "probes.jsonl"
    journal = Journal(path, "fp1", "cpu", 3, resume=False)
    journal.environment("off", {"torch": "x"})
    journal.outcome(_outcome("a"))
    journal.outcome(_outcome("b"))
    journal.close()
    with open(path, "a") as f:
        f.write('{"kind": "outcome", "probe": "c", "pass_na')  # killed mid-write
    done, envs, _ = read_journal(path, "fp1")
    assert set(done) == {("a", "off"), ("b", "off")} and envs == {"off": {"torch": "x"}}
    resumed = Journal(path, "fp1", "cpu", 3, resume=True)
    resumed.outcome(_outcome("c"))
    resumed.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e.get("probe") for e in lines if e["kind"] == "outcome"] == ["a", "b", "c"]
    with pytest.raises(JournalError, match="another probe plan"):
        Journal(path, "fp2", "cpu", 3, resume=True)


def test_progress_bar_text():
    # 24 * 120 // 251 = 11 filled; ETA 60 s / 120 * 131 left = 65.5 s -> 1:06
    assert bar_text("off", 120, 251, 3, 60.0) == (
        "probing (off) [###########.............] 120/251 · failing 3 · ETA 1:06")
    assert bar_text("on", 0, 5, 0, 0.0).endswith("0/5 · failing 0 · ETA --:--")


class Found:
    """A RowMeasurement as reconcile.py makes it."""

    def __init__(self, verdict: Verdict, device: str):
        self.verdict = verdict
        self.evidence = Evidence(f"probe-{verdict.value}", f"measured on {device}: it {verdict.value}", "probe")
        self.remedy = None if verdict == Verdict.NATIVE else "move it to the CPU"
        self.block = {"device": device, "verdict": verdict.value, "rule": f"probe-{verdict.value}", "text": "it ran",
                      "probes": 1, "off": None, "on": None, "max_abs_err": None, "max_rel_err": None,
                      "compared": [], "reference": []}


def _measured(device: str, stands: bool):
    base = report()
    found = {(r.op, r.dtypes): Found(Verdict.NATIVE if i != 4 else Verdict.MISMATCH, device)
             for i, r in enumerate(base.rows)}
    section = {"device": device, "stands_for_mps": stands, "note": "…", "probes": 5, "calls": 11,
               "passes": {"off": {"probes": 5}, "on": {"probes": 0}}, "outcomes": {"native": 4, "mismatch": 1},
               "shapes": {"policy": "full", "max_elements": None, "capped_probes": 0},
               "tolerances": {"float32": {"atol": 1e-5, "rtol": 1e-5}}, "environment": {"off": {}, "on": None},
               "run": {"wall_s": 1.0}}
    # what scan.build_report does with a measurement (the graph aside: this report has no trace)
    rows = measured_rows(base.rows, found, stands)
    lane = decide_lane(rows, source=Source.MEASURED) if stands else base.lane
    return replace(base, rows=rows, mode="measured" if stands else base.mode, lane=lane,
                   measurement={**section, "source": "measured", "disagreements": disagreements(rows)})


def test_a_cpu_measurement_never_stands_in_for_mps():
    base, measured = report(), _measured("cpu", stands=False)
    assert measured.mode == "predicted" and measured.lane == base.lane
    assert [r.verdict for r in measured.rows] == [r.verdict for r in base.rows]
    assert all(r.measured["device"] == "cpu" and r.predicted is None for r in measured.rows)
    doc = measured.to_dict()
    assert [d["op"] for d in doc["measurement"]["disagreements"]] == [
        "aten::upsample_bicubic2d.out", "aten::add.Tensor", "aten::_foreach_mul_.Scalar", "aten::linear"]
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    text = render_table(measured, width=100)
    assert "Measured on cpu (not MPS: verdicts stay predicted)" in text
    # the linear row stays predicted native (no finding); its cpu measurement is listed, never as a verdict
    assert "≠ aten::linear [float32×2]: predicted native, measured mismatch on cpu — it ran" in text
    assert "measured on cpu (not MPS): native — it ran" in text  # a finding's own cpu measurement, beside it


def test_a_mps_measurement_replaces_the_verdicts_and_keeps_the_predictions():
    measured = _measured("mps", stands=True)
    assert measured.mode == "measured" and measured.lane.name == "linux-gpu-first"
    linear = measured.rows[4]
    assert linear.verdict == Verdict.MISMATCH and linear.source.value == "measured"
    assert linear.predicted["verdict"] == "native" and linear.disagrees
    jsonschema.Draft202012Validator(load_schema()).validate(measured.to_dict())
    text = render_table(measured, width=100)
    lines = text.splitlines()
    assert not any("aten::convolution" in line for line in lines)  # it agrees: no disagreement, no finding
    # the measurement's disagreement with the prediction, and the finding with the prediction beside it
    assert "≠ aten::linear [float32×2]: predicted native, measured mismatch on mps — it ran" in text
    finding = text[text.index("[1] "):]
    assert "mismatch (measured)" in finding.splitlines()[0] and "    predicted: native (rule-native)" in finding


def test_a_cap_the_cpu_refuses_falls_back_to_full_shapes_in_the_worker():
    # resnet18's first convolution backward: halving 64 and 32 alike makes grad_output 16x16 for a
    # stride-2 convolution of a 16x16 input; the meta kernel accepts it, oneDNN does not
    grad = TensorSpec("float32", (2, 64, 32, 32), (65536, 1024, 32, 1))
    x, w = TensorSpec("float32", (2, 3, 64, 64), (12288, 4096, 64, 1)), TensorSpec("float32", (64, 3, 7, 7),
                                                                                    (147, 49, 7, 1))
    call = make("aten::convolution_backward", [grad, x, w], {"args": [
        {"t": 0}, {"t": 1}, {"t": 2}, [0], [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [False, True, False]],
        "kwargs": {}})
    proposed = cap(call, 1 << 14, lambda op: False)
    assert proposed.shrink
    previous = torch.is_warn_always_enabled()
    try:
        outcome = run_one(proposed, "off", Backend())
    finally:
        torch.set_warn_always(previous)
    assert outcome.clean and outcome.extra["shapes"].startswith("full: the capped call failed on the CPU")


WORKER_SIDE = ("worker", "zygote", "replay", "rebuild", "comparison", "backends", "texts", "protocol", "shrink")


def test_the_worker_side_stays_light():
    """The child imports torch, op_probes and its own modules only: never rich, networkx, yaml or the
    trace/report stages (checked on the source, transitively through opscan imports)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    allowed = {f"opscan.probe.{m}" for m in WORKER_SIDE} | {"opscan.opkey", "opscan.probe", "opscan"}
    files = [root / "opscan" / "probe" / f"{m}.py" for m in WORKER_SIDE] + sorted((root / "op_probes").glob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                assert top not in ("rich", "networkx", "yaml"), (path.name, name)
                if top == "opscan":
                    assert name in allowed, (path.name, name)
