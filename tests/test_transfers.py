"""Transfer accounting (opscan/graph/transfers.py) checked against hand computations, the residency rule
(AdamW's CPU step counters are host work), explicit moves, fallback regions and the lane rule."""

from __future__ import annotations

from opscan.graph.lanes import transfer_reasons
from opscan.graph.lanes import decide_lane
from opscan.graph.transfers import Cost, NodeTransfer, Transfers

from helpers_graph import HEAVY, MOVES, REL_ATTENTION, node_of, scanned
from helpers_report import ROWS


def cost(d2h, d2h_syncs, h2d, h2d_syncs) -> dict:
    return {"d2h_bytes": d2h, "h2d_bytes": h2d, "d2h_syncs": d2h_syncs, "h2d_syncs": h2d_syncs,
            "bytes": d2h + h2d, "syncs": d2h_syncs + h2d_syncs}


def test_unsupported_op_in_attention_matches_the_hand_computation():
    t = scanned(REL_ATTENTION).transfers
    # forward, aten::take(bias_table float32[2, 15], rel_index int64[2, 8, 8]) -> float32[2, 8, 8]:
    #   to host: the table 2*15*4 = 120 B and the index 2*8*8*8 = 1024 B -> 1144 B, one blocking copy each (2)
    #   to device: the gathered bias 2*8*8*4 = 512 B, 1 copy
    assert t["by_phase"]["forward"] == cost(1144, 2, 512, 1)
    # backward, take's backward: aten::put_(zeros float32[2, 15], rel_index, grad float32[2, 8, 8], accumulate)
    #   to host: 120 + 1024 + 512 = 1656 B in 3 copies
    #   to device: put_ mutates and returns its first argument: copied back once, 120 B, 1 copy
    assert t["by_phase"]["backward"] == cost(1656, 3, 120, 1)
    # per step: to host 1144 + 1656 = 2800 B (5 syncs), to device 512 + 120 = 632 B (2 syncs)
    assert t["step"] == cost(2800, 5, 632, 2)
    assert t["fallback"] == {**cost(2800, 5, 632, 2), "calls": 2}
    assert t["by_module"] == {"block.attn": cost(2800, 5, 632, 2)}
    assert [(r["op"], r["phase"], r["bytes"]) for r in t["ranking"]] == [
        ("aten::put_", "backward", 1776), ("aten::take", "forward", 1656)]


def test_each_fallback_call_is_a_region_and_the_index_can_stay_on_the_host():
    regions = scanned(REL_ATTENTION).transfers["regions"]
    assert [r["ops"] for r in regions] == [["aten::take"], ["aten::put_"]]
    take, put = regions
    # moved explicitly, `take` copies the table in (120 B) and the bias out (512 B); rel_index is read only
    # by the two fallback calls, so it can live on the host: 1024 B and 1 sync saved per region
    assert take["explicit"] == cost(120, 1, 512, 1)
    assert take["saved"] == cost(1024, 1, 0, 0)
    # put_: its zeros (120 B) and the incoming gradient (512 B) in, the table gradient (120 B) out
    assert put["explicit"] == cost(632, 2, 120, 1)
    assert put["saved"] == cost(1024, 1, 0, 0)
    assert all(k.startswith("input int64[2x8x8]") for r in regions for k in r["keep_on_host"])


def test_adamw_for_loop_step_counters_are_host_work_not_syncs():
    report = scanned(REL_ATTENTION)
    g = report.step_graph
    reads = [n for n, d in g.nodes(data=True) if d.get("op") == "aten::_local_scalar_dense"]
    assert len(reads) == 15  # one .item() of the CPU step counter per parameter (15 parameters)
    for node in reads:
        (source,) = {a.producer for a in g.nodes[node]["args"]}
        producer = g.nodes[source]
        assert producer["kind"] == "call" and producer["op"] == "aten::add_.Tensor"  # step_t += 1, on the host
    assert report.transfers["explicit"]["calls"] == 0
    assert all(n in g.graph["transfers"].host for n in reads)


def test_explicit_moves_are_transfers_and_syncs():
    t = scanned(MOVES).transfers
    # y = lin(x) is float32[2, 4] = 32 B; y.sum().item() reads 4 B; .cpu(), .tolist() and f"{y}" copy 32 B
    assert t["explicit"] == {**cost(4 + 32 + 32 + 32, 4, 0, 0), "calls": 4}
    assert sorted((r["label"], r["bytes"]) for r in t["ranking"] if r["kind"] == "explicit") == [
        ("cpu()", 32), ("item()", 4), ("print", 32), ("tolist()", 32)]
    assert t["fallback"]["calls"] == 0
    # torch.tensor([1., 2., 3., 4.], device=x.device): built from Python data on the host, 4*4 = 16 B copied over
    assert t["implicit"] == {**cost(0, 0, 16, 1), "calls": 1}


def test_host_work_on_a_copy_is_not_a_transfer():
    report = scanned(MOVES)
    g = report.step_graph
    host = g.graph["transfers"].host
    total = sorted((n for n, d in g.nodes(data=True) if d.get("op") == "aten::sum.dim_IntList"
                    and d["phase"] == "forward"), key=lambda n: g.nodes[n]["pos"])
    assert len(total) == 2 and total[-1] in host  # host.sum() runs on the host copy
    assert total[0] == node_of(report, "aten::sum.dim_IntList") and total[0] not in host  # y.sum(): device


def test_fallback_moving_more_than_the_footprint_makes_the_lane_linux_gpu_first():
    report = scanned(HEAVY)
    f = report.transfers["footprint"]
    assert f["fallback_exceeds"] and f["fallback_bytes"] > f["parameters_bytes"] + f["activations_bytes"]
    assert report.lane.name == "linux-gpu-first"
    head, *rows = report.lane.reasons
    assert "more than the step's parameters and activations together" in head
    assert [r.split(" [")[0] for r in rows] == ["aten::put_", "aten::take"]  # the heaviest rows first


def test_below_the_footprint_the_verdict_rules_decide():
    report = scanned(REL_ATTENTION)
    assert not report.transfers["footprint"]["fallback_exceeds"]
    assert report.lane.name == "dual-track"


def _transfers(fallback_bytes: int, footprint: int) -> Transfers:
    node = NodeTransfer("c0", "fallback", "CPU fallback", "aten::upsample_bicubic2d.out", "float32", "decoder.up",
                        "forward", 1, Cost(d2h_bytes=fallback_bytes, d2h_syncs=1))
    return Transfers((node,), frozenset(), footprint, 0)


def test_transfer_rule_is_strictly_more_and_keeps_verdict_reasons():
    assert transfer_reasons(_transfers(100, 100), ROWS) == ()
    reasons = transfer_reasons(_transfers(101, 100), ROWS)
    assert reasons[0].text.startswith("the CPU fallback moves 101 B per step (1 syncs)")
    assert reasons[1].text.startswith("aten::upsample_bicubic2d.out [float32] is cpu_fallback: moves 101 B")
    assert [(r.kind.value, r.row) for r in reasons] == [("transfer", None), ("transfer", 1)]  # row 1: upsample
    lane = decide_lane(ROWS, reasons)
    assert lane.name == "linux-gpu-first" and lane.why == reasons
    assert decide_lane(ROWS).name == "dual-track"  # unchanged without the transfer rule
