"""A measured report stands on its measurements: the step graph, the transfers and the lane are rebuilt from the
measured verdicts of the MPS view's calls (issue 16), on the SIMULATED MPS backend (tests/simulated_mps, tests
only, handed to the Python API) — and a measurement on cpu never replaces MPS's predicted lane.

The target, tests/targets/fallback_heavy.py: y = x * scale (x: 256 float32), eight torch.take(y, index) with an
int64 index of 256, stacked (aten::cat of eight 1x256 views) and summed; AdamW. Predicted for torch 2.14.1, take
and its backward put_ have no MPS kernel (unsupported) and the CPU fallback of their 16 calls moves 72.0 KB per
step, more than the step's 3,076 B of parameters and 18,440 B of activations: linux-gpu-first from transfers.
"""

from __future__ import annotations

import pytest

import simulated_mps
from opscan.graph.lanes import Reason, ReasonKind
from opscan.probe.stage import ProbeOptions
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import TARGETS

TARGET = f"{TARGETS}/fallback_heavy.py:build_model"


def _simulated(script: dict):
    probe = ProbeOptions(device="mps", workers=1, double=simulated_mps.double(script))
    return scan(ScanOptions(TARGET, probe=probe))


@pytest.fixture(scope="module")
def predicted():
    return scan(ScanOptions(TARGET))


@pytest.fixture(scope="module")
def all_native(monkeypatch_module):
    """The issue's reproduction: every op native on the (simulated) Mac."""
    return _simulated({"default": "native"})


@pytest.fixture(scope="module")
def both_ways(monkeypatch_module):
    """Prediction and measurement disagree in both directions: take and put_ (predicted unsupported) run
    natively; mul.Tensor (predicted native) raises a kernel error; cat (predicted native) falls back to the CPU."""
    return _simulated({"default": "native", "ops": {"aten::mul.Tensor": "error", "aten::cat": "always_cpu"}})


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)  # the simulator reads it at import, as torch does
        yield mp


def _row(report, op: str) -> int:
    return next(i for i, r in enumerate(report.rows) if r.op.display == op)


def test_the_prediction_is_linux_gpu_first_from_its_transfers(predicted):
    lane = predicted.lane.to_dict()
    assert lane["name"] == "linux-gpu-first" and lane["source"] == "predicted"
    # 8 take calls x 4,096 B (y 1 KB + index 2 KB to the host, 1 KB back) + 8 put_ x 5,120 B = 73,728 B = 72.0 KB
    assert predicted.transfers["fallback"]["bytes"] == 8 * 4096 + 8 * 5120
    assert [(w["kind"], w["row"]) for w in lane["why"]] == [
        ("transfer", None), ("transfer", _row(predicted, "aten::put_")), ("transfer", _row(predicted, "aten::take"))]
    assert lane["why"][0]["text"].startswith("the CPU fallback moves 72.0 KB per step (56 syncs)")


def test_every_row_measured_native_makes_the_lane_mac_first(all_native, predicted):
    assert all(r.verdict == Verdict.NATIVE and r.source.value == "measured" for r in all_native.rows)
    lane = all_native.lane
    assert lane.name == "mac-first" and lane.source.value == "measured"
    n = len(all_native.rows)
    assert lane.why == (Reason(ReasonKind.ROW, f"all {n} rows are native"),
                        Reason(ReasonKind.MEMORY, all_native.memory["lane"]["reason"]))
    # no fallback was measured: no transfer moves a byte, and no node of the graph says unsupported
    assert all_native.transfers["fallback"]["bytes"] == 0 and not all_native.transfers["footprint"]["fallback_exceeds"]
    verdicts = {d["verdict"] for _, d in all_native.step_graph.nodes(data=True) if d["kind"] == "call"}
    assert verdicts == {"native"}
    doc = all_native.to_dict()
    assert doc["mode"] == "simulated" and doc["measurement"]["device"] == "simulated-mps (tests only)"
    assert {doc[s]["source"] for s in ("graph", "transfers", "measurement")} == {"measured"}
    assert {doc[s]["source"] for s in ("upgrade", "memory")} == {"predicted"}
    assert [d["op"] for d in doc["measurement"]["disagreements"]] == ["aten::take", "aten::put_"]
    assert predicted.rows[_row(predicted, "aten::take")].verdict == Verdict.UNSUPPORTED  # it was predicted so


def test_disagreements_both_ways_pin_the_measured_lane(both_ways):
    mul, take, cat, put = (_row(both_ways, op) for op in ("aten::mul.Tensor", "aten::take", "aten::cat",
                                                          "aten::put_"))
    doc = both_ways.to_dict()
    assert [(d["row"], d["predicted"], d["measured"]) for d in doc["measurement"]["disagreements"]] == [
        (mul, "native", "error"), (take, "unsupported", "native"), (cat, "native", "cpu_fallback"),
        (put, "unsupported", "native")]
    # the lane: mul's measured error alone decides it; nothing of take's predicted fallback is left
    lane = both_ways.lane
    assert lane.name == "linux-gpu-first" and lane.source.value == "measured"
    assert [(r.kind, r.row) for r in lane.why] == [(ReasonKind.ROW, mul)]
    assert lane.reasons[0].startswith("aten::mul.Tensor [float32×2] is error: measured on simulated-mps")
    assert not any("take" in r or "put_" in r for r in lane.reasons)
    # the transfers follow the measurement: cat's one forward call falls back — its eight 1x256 float32 inputs go
    # to the host (8 x 1,024 B, one blocking copy each) and its 8x256 float32 result comes back (8,192 B, one copy)
    t = both_ways.transfers
    assert t["fallback"] == {"d2h_bytes": 8192, "h2d_bytes": 8192, "d2h_syncs": 8, "h2d_syncs": 1,
                             "bytes": 16384, "syncs": 9, "calls": 1}
    assert {r["op"] for r in t["ranking"] if r["kind"] == "fallback"} == {"aten::cat"}
    # 16,384 B is less than the 3,076 + 18,440 = 21,516 B footprint: no transfer reason
    assert not t["footprint"]["fallback_exceeds"]
    g = both_ways.step_graph
    by_op = {d["op"]: d["verdict"] for _, d in g.nodes(data=True) if d["kind"] == "call" and d["phase"] == "forward"}
    assert (by_op["aten::take"], by_op["aten::mul.Tensor"], by_op["aten::cat"]) == ("native", "error",
                                                                                     "cpu_fallback")


def test_a_cpu_measurement_keeps_the_predicted_graph_and_lane(predicted):
    """cpu is not MPS: the lane, graph and transfers stay predicted for MPS, and say so."""
    measured = scan(ScanOptions(TARGET, probe=ProbeOptions(device="cpu", workers=1)))
    assert measured.mode == "predicted" and measured.lane == predicted.lane
    assert measured.transfers == predicted.transfers and measured.transfers["source"] == "predicted"
    assert measured.measurement["source"] == "measured" and not measured.measurement["stands_for_mps"]
    assert all(r.source.value == "predicted" and r.measured["device"] == "cpu" for r in measured.rows)
