"""Memory: the estimate (a hand-made timeline, PyTorch's own MemTracker as the oracle, the attention scores
of MPS's math path), the sizing runs against real traces at those batches, the Mac table and its console
line, the lane rule, the report's memory section against the schema, HTML and console."""

from __future__ import annotations

import json
import random
from importlib import resources

import jsonschema
import pytest
import torch
from torch import nn

from conftest import EXAMPLES, TARGETS
from opscan.memory.estimate import estimate, without_indices
from opscan.memory.records import Block, Timeline
from opscan.memory.section import fit_line, lane_effect
from opscan.memory.sizing import GB, MACS, Curve, _upper, fit_curve, for_macos, size_macs, verdict
from opscan.memory.tracker import track_step
from opscan.graph.lanes import decide_lane
from opscan.scan import ScanOptions, scan
from opscan.trace import step

ATTENTION = f"{TARGETS / 'attention_memory.py'}:build_model"
PHASE = {0: "forward", 1: "forward", 2: "loss", 3: "backward", 4: "backward", 5: "optimizer"}


def _where(clock):
    return PHASE[clock], f"m{clock}", f"aten::op{clock}"


def _timeline() -> Timeline:
    blocks = (Block(100, "float32", "cpu", -1, "parameters"), Block(10, "float32", "cpu", -1, "inputs"),
              Block(50, "float32", "cpu", 0), Block(20, "float32", "cpu", 1),
              Block(100, "float32", "cpu", 3, "gradients"), Block(200, "float32", "cpu", 5, "optimizer_state"),
              Block(30, "float32", "cpu", 5))
    return Timeline(blocks, (1, 2, 3, 4, -4, 5, -3, 6, 7, -7, -5), batch=2)


def test_estimate_of_a_hand_made_timeline():
    est = estimate(_timeline(), _where)
    # first step, live after each allocation: 100 110 160 180 | 260 | 410 440 -> 440 (optimizer)
    assert est.first_step == 440
    # steady: the state (200, alive at the end) exists from the start: 360 380 (forward), 260+200 (backward)
    assert est.peak.bytes == 460 and (est.peak.phase, est.peak.module, est.peak.op) == ("backward", "m3", "aten::op3")
    assert dict(est.peak.categories) == {"parameters": 100, "inputs": 10, "gradients": 100, "optimizer_state": 200,
                                         "activations": 50, "temporaries": 0}
    assert {p.phase: p.bytes for p in est.phases} == {"forward": 380, "backward": 460, "optimizer": 440}
    assert est.optimizer_excess == 30  # 440 at its peak, 410 when it started
    assert est.state == (200, 100) and est.bf16_peak == 230  # every block float32: halved
    assert dict(est.end_of_step) == {"parameters": 100, "inputs": 10, "gradients": 0, "optimizer_state": 200,
                                     "activations": 0, "temporaries": 0}


def test_max_pool_indices_are_not_counted_on_mps():
    # MPS's own max_pool2d keeps no int64 indices: the blocks its span (call 0) made in int64 count 0 bytes
    blocks = (Block(64, "float32", "cpu", 0), Block(128, "int64", "cpu", 0), Block(8, "int64", "cpu", 1))
    timeline = without_indices(Timeline(blocks, (1, 2, 3)), frozenset({0}))
    assert [b.nbytes for b in timeline.blocks] == [64, 0, 8]


def _mlp_step(tracker_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    x = torch.randn(32, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = tracker_factory(model, optimizer, x)
    with tracker:
        step.run_train_step(model, optimizer, x)
    return tracker


def test_first_step_peak_equals_pytorchs_memtracker():
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")

    def theirs(model, optimizer, x):
        t = mem_tracker.MemTracker()
        t.track_external(model, optimizer, x)
        return t

    ours = _mlp_step(lambda model, optimizer, x: track_step(model, x))
    reference = _mlp_step(theirs).get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    first = estimate(ours.timeline(32), lambda c: ("forward", "", "")).first_step
    assert first == reference


def test_the_estimate_sees_the_scores_of_mps_attention():
    from opscan.target.load import load_target
    from opscan.trace import trace_step

    def forward_activations(steer: bool) -> int:
        target = load_target(ATTENTION, {}, [])
        trackers: list = []
        trace = trace_step(target, has_mps_kernel=(lambda op: True) if steer else None,  # None: the lens is off
                           memory=lambda m, i, clock: trackers.append(track_step(m, i, clock)) or trackers[-1])
        calls = trace.calls
        est = estimate(trackers[0].timeline(2), lambda c: (calls[c].phase, calls[c].module, calls[c].op.display))
        return dict(next(p for p in est.phases if p.phase == "forward").categories)["activations"]

    scores = 2 * 4 * 256 * 256 * 4  # B x H x L x L float32 = 2 MiB
    assert forward_activations(steer=True) >= forward_activations(steer=False) + scores


@pytest.fixture(scope="module")
def attention_report():
    return scan(ScanOptions(ATTENTION))


def test_sizing_runs_match_real_traces_at_those_batches(attention_report):
    points = attention_report.memory["batch_scaling"]["points"]
    assert attention_report.memory["batch_scaling"]["method"] == "meta"
    for point in points:  # meta tensors, optimizer stood in for: the same bytes as a full scan at that batch
        again = scan(ScanOptions(ATTENTION, args={"batch": point["batch"]}, fx=False))
        assert point["peak_bytes"] == again.memory["peak_bytes"]


@pytest.mark.parametrize("spec", [ATTENTION, f"{EXAMPLES / 'llama.py'}:build_model"])
def test_meta_cache_leaves_the_sizing_runs_unchanged(spec):
    # the sizing runs' meta kernels served from MetaCache: every allocation event the same as running them
    from opscan.memory import batch
    from opscan.predict.calls import has_mps_kernel
    from opscan.knowledge import load_knowledge
    from opscan.target.load import load_target
    from opscan.trace.call_cache import MetaCache

    kb, target = load_knowledge(), load_target(spec, {}, [])
    size = batch.batch_of(target.inputs)
    lens, stand = (has_mps_kernel(kb), kb.macos), batch.Stand(1000, 10, 5)
    cache = MetaCache()
    for k in batch.FACTORS:  # one cache for both runs, as scaled_runs shares it
        plain = batch._run(target, "meta", k, size, None, False, lens, stand)
        cached = batch._run(target, "meta", k, size, None, False, lens, stand, cache=cache)
        assert cached == plain and len(plain.curve) > 20
    assert cache.hits > 0  # calls were served from it (repeated layers, weights used in both runs)


def test_memory_section_is_valid_and_reaches_lane_console_and_html(attention_report):
    schema = json.loads(resources.files("opscan").joinpath("schema/report-v4.json").read_text(encoding="utf-8"))
    doc = attention_report.to_dict()
    jsonschema.Draft202012Validator(schema).validate(doc)
    memory = doc["memory"]
    assert [m["ram_gb"] for m in memory["macs"]] == [8, 16, 24, 32, 36, 48, 64, 96, 128, 192, 256, 512]
    assert memory["line"] == "peak 6.4 MB: fits 8 GB Macs" and memory["lane"]["fit"] == "fits"
    assert memory["macs"][0]["max_batch"] > 100  # ~3.3 MB per sample (the scores and their softmax)
    assert doc["lane"]["reasons"][-1].startswith("memory peak 6.4 MB fits 8 GB Macs and larger")
    from opscan.render import render_html, render_table

    assert "Memory (estimate): peak 6.4 MB: fits 8 GB Macs · at (model) in backward" in render_table(
        attention_report, width=200)
    page = render_html(attention_report)
    assert page.count("<tr data-ram=") == 12 and 'id="memory-phases"' in page


def _gb(x: float) -> int:
    return int(x * GB)


def test_mac_verdicts_and_the_console_line():
    mac8, mac16 = MACS[0], MACS[1]
    # 8 GB: recommended 2/3 x 8 = 5.33 GB, fits up to 90% of it (4.8 GB), runs up to min(1.7 x 5.33, 8) = 8 GB
    assert [verdict(_gb(g), mac8) for g in (4.7, 5.0, 7.9, 8.1)] == ["fits", "tight", "tight", "does_not_fit"]
    assert verdict(_gb(9.5), mac16) == "fits"  # 0.9 x 10.67 = 9.6
    fits = size_macs(_gb(7.9), _gb(4.0), None, None, 14)
    assert fit_line(_gb(7.9), fits) == "peak 7.9 GB: fits 16 GB Macs, tight on 8 GB"
    assert lane_effect(_gb(7.9), fits)["fit"] == "fits"
    # 512 GB: recommended 384, fits up to 345.6, tight up to the RAM (512 < 1.7 x 384)
    tight = size_macs(_gb(400), _gb(200), None, None, 14)
    assert fit_line(_gb(400), tight) == "peak 400.0 GB: fits no Mac, tight on 512 GB"
    assert lane_effect(_gb(400), tight)["fit"] == "tight"
    none = size_macs(_gb(600), _gb(300), None, None, 14)
    assert fit_line(_gb(600), none) == "peak 600.0 GB: does not fit any Mac (the largest has 512 GB)"
    assert for_macos(MACS[5], 26).fraction == 0.78 and for_macos(MACS[3], 26).fraction == MACS[3].fraction


def test_lane_takes_the_memory_fit():
    reason = "memory peak 9 GB is tight on every Mac it runs on (8 GB): over 90% of ..."
    assert decide_lane((), (), {"fit": "tight", "reason": reason}).name == "dual-track"
    lane = decide_lane((), (), {"fit": "does_not_fit", "reason": "memory peak 900 GB fits no Mac: ..."})
    assert lane.name == "linux-gpu-first" and lane.reasons == ("memory peak 900 GB fits no Mac: ...",)
    assert decide_lane((), (), {"fit": "fits", "reason": "memory peak 1 GB fits 8 GB Macs"}).reasons == (
        "all 0 rows are native", "memory peak 1 GB fits 8 GB Macs")


def test_largest_batch_from_lines():
    curve = Curve(((1 * GB, 0.5 * GB),))
    assert curve.largest(0.9 * 2 / 3 * 16 * GB) == 17  # (9.6 - 1) / 0.5 = 17.2
    assert Curve(((10 * GB, 1.0),)).largest(GB) == 0  # even batch 1 is over
    assert Curve(((GB, 0.0),)).largest(2 * GB) is None  # the batch does not move it
    # two runs (batch 4 and 6), three events each: lines 10, 10 + 10b, 10 + 5b; traced peak 32 at batch 2
    fitted = fit_curve(((4, (10, 50, 30)), (6, (10, 70, 40))), 2, 32)
    assert fitted.at(2) == 32 and fitted.at(5) == 62


def test_upper_envelope_keeps_the_maximum():
    rng = random.Random(0)
    for _ in range(200):
        lines = tuple((rng.uniform(-100, 1000), rng.choice([0, 0.5, 1, 3, rng.uniform(0, 9)])) for _ in range(20))
        hull = _upper(lines)
        for b in (1, 1.5, 3, 10, 1e4):
            assert max(c + s * b for c, s in hull) == pytest.approx(max(c + s * b for c, s in lines))


def test_the_pure_memory_modules_do_not_import_torch():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "opscan"
    for name in ("memory/__init__.py", "memory/records.py", "memory/estimate.py", "memory/sizing.py",
                 "memory/section.py", "render/html_memory.py"):
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        imported = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m == "torch" or m.startswith("torch.") for m in imported), name


def test_batch_line_shares_one_cell_for_every_mac_beyond_the_search_cap():
    from opscan.memory.section import batch_line
    from opscan.memory.sizing import MAX_BATCH, Fit, Mac

    def fit(gb, batch):
        return Fit(Mac(gb, 0.75, "reported", "test"), "fits", batch, batch, "fits", batch)

    fits = (fit(8, 0), fit(16, 300), fit(24, None), fit(32, None))
    assert batch_line(fits, 2) == f"largest batch that fits (traced at 2): 16 GB 300 · 24 GB and larger: over {MAX_BATCH}"
    assert batch_line(fits[:3], 2) == f"largest batch that fits (traced at 2): 16 GB 300 · 24 GB: over {MAX_BATCH}"
    assert batch_line(fits, 2, scaled=False) == ""
