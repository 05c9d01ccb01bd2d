"""Repeated layers traced once (opscan/trace/repeat.py): with fake tensors, a stack proven to repeat runs layers
0, 1, 2 and N-1 and replicates layer 2's calls and memory events at 3 .. N-2.

Each test scans a target twice, with the shortcut and with `repeat=False` (--no-repeat: every layer traced),
and compares the reports as canonical JSON — rows, verdicts, evidence, summaries, the graph and transfer
sections, the memory estimate — with only the shortcut's own note taken out of the notes; the step graphs
(nodes, edges and their attributes) are compared too. Where the layers do not repeat the shortcut must say so
in a note and trace every layer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from opscan.scan import ScanOptions, scan
from opscan.trace.repeat import find_stack

TARGETS = Path(__file__).parent / "targets" / "repeat.py"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_big.py"
NOTE = "repeated layers: "


def _scans(spec: str, args: dict):
    short = scan(ScanOptions(spec, args=args, fake=True))
    full = scan(ScanOptions(spec, args=args, fake=True, repeat=False))
    return short, full


def _canonical(report) -> str:
    data = copy.deepcopy(report.to_dict())
    data.pop("environment")
    data["trace"]["notes"] = [n for n in data["trace"]["notes"] if not n.startswith(NOTE)]
    return json.dumps(data, sort_keys=True, indent=1)


def _graph(report):
    g = report.step_graph
    nodes = sorted((n, json.dumps(d, sort_keys=True, default=repr)) for n, d in g.nodes(data=True))
    edges = sorted((a, b, json.dumps(d, sort_keys=True, default=repr)) for a, b, d in g.edges(data=True))
    return nodes, edges


def _notes(report) -> list[str]:
    return [n for n in report.trace["notes"] if n.startswith(NOTE)]


def _assert_equal(short, full) -> None:
    assert short.memory is not None and short.memory == full.memory
    assert short.graph == full.graph and short.transfers == full.transfers
    assert _graph(short) == _graph(full)
    assert _canonical(short) == _canonical(full)


@pytest.mark.parametrize(("spec", "args", "replicated"), [
    (f"{TARGETS}:build_model", {"layers": 6}, "layers 3 .. 4 replicated from layer 2"),
    (f"{EXAMPLE}:build_model", {"size": "tiny", "layers": 6, "seq": 16}, "layers 3 .. 4 replicated from layer 2"),
])
def test_replicated_layers_report_like_a_full_trace(spec, args, replicated):
    short, full = _scans(spec, args)
    assert any(replicated in n for n in _notes(short)), _notes(short)
    assert not _notes(full)
    assert short.trace["calls"] == full.trace["calls"] > 0
    _assert_equal(short, full)


def test_inference_step_replicates_the_forward():
    short = scan(ScanOptions(f"{TARGETS}:build_model", args={"layers": 7}, fake=True, inference=True))
    full = scan(ScanOptions(f"{TARGETS}:build_model", args={"layers": 7}, fake=True, inference=True, repeat=False))
    assert any("layers 3 .. 5 replicated" in n for n in _notes(short)), _notes(short)
    assert set(short.phases) == {"forward"}
    _assert_equal(short, full)


@pytest.mark.parametrize("period", [2, 4])
def test_alternating_layers_are_traced_in_full(period):
    # layer_idx % period changes the ops: the layers are alike before the step; period 4 shows only in layer 3,
    # which the short run never runs: the layers reading their index is what refuses it
    short, full = _scans(f"{TARGETS}:alternating", {"layers": 8, "period": period})
    [note] = _notes(short)
    assert "not replicated, a layer's code reads its index: layers.0.layer_idx (mod)" in note, note
    assert "every layer traced" in note
    _assert_equal(short, full)


def test_foreach_optimizer_is_traced_in_full():
    # one _foreach_ call takes every layer's parameters: nothing per layer to replicate
    spec = f"{TARGETS.parent / 'repeat_foreach.py'}:build_model"
    short, full = _scans(spec, {"layers": 6})
    [note] = _notes(short)
    assert "not replicated" in note and "every layer traced" in note, note
    from opscan.scan import prepare

    traced = prepare(ScanOptions(spec, args={"layers": 6}, fake=True, memory=False)).trace
    assert any(c.op.name.startswith("_foreach_") for c in traced.calls if c.phase == "optimizer")
    _assert_equal(short, full)


def test_alternating_attention_config_is_refused_before_the_step():
    short, full = _scans(f"{TARGETS}:qwen_alternating", {"layers": 6})
    [note] = _notes(short)
    assert "config.layer_types mixes full_attention, sliding_attention" in note or "differs" in note, note
    _assert_equal(short, full)


def test_layers_of_two_classes_are_no_stack():
    from tests.targets.repeat import by_class

    model, _ = by_class(6)
    stack, reason = find_stack(model)
    assert stack is None and "different classes" in reason


def test_layer_with_its_own_hook_is_no_stack():
    from tests.targets.repeat import build_model

    model, _ = build_model(6)
    model.layers[4].up.register_forward_hook(lambda *a: None)
    stack, reason = find_stack(model)
    assert stack is None and "layer 4.up has hooks of its own" in reason
    model2, _ = build_model(6)
    stack, reason = find_stack(model2)
    assert stack is not None and stack.path == "layers" and stack.runs == (0, 1, 2, 5)


def test_real_tensors_trace_every_layer():
    report = scan(ScanOptions(f"{TARGETS}:build_model", args={"layers": 6}, auto_fake=False))
    assert not _notes(report)


def test_full_trace_storage_numbering_is_canonical():
    # renumber() numbers storages as the recorder meets them: on a full trace it changes nothing
    from opscan.scan import prepare
    from opscan.trace.replicate import renumber
    from tests.targets.repeat import build_model

    trace = prepare(ScanOptions(f"{TARGETS}:build_model", args={"layers": 6}, fake=True, repeat=False,
                                memory=False)).trace
    given = len(list(build_model(6)[0].parameters())) + 1  # parameters, then the input: numbered before the step
    assert renumber(list(trace.calls), given + 1) == trace.calls


def test_no_repeat_flag():
    from opscan.cli.scan_flags import build_parser, scan_options

    args = build_parser().parse_args(["t.py:f", "--no-repeat"])
    assert scan_options(args, None).repeat is False
    assert scan_options(build_parser().parse_args(["t.py:f"]), None).repeat is True


def test_per_layer_function_wrappers_in_a_dict_are_alike():
    # transformers 5.25 (with `kernels`) gives each attention layer its own instance of a stateless wrapper in a
    # plain dict attribute (`_kernel_funcs`); equal instances of one class are alike, unequal ones are not
    from tests.targets.repeat import kernel_funcs

    model, _ = kernel_funcs(6)
    stack, reason = find_stack(model)
    assert stack is not None and reason is None, reason
    model, _ = kernel_funcs(6, odd_scale=2.0)
    stack, reason = find_stack(model)
    assert stack is None and "layer 1's attribute _kernel_funcs" in reason, reason
    short, full = _scans(f"{TARGETS}:kernel_funcs", {"layers": 6})
    assert any("layers 3 .. 4 replicated from layer 2" in n for n in _notes(short)), _notes(short)
    _assert_equal(short, full)


def test_every_field_of_a_call_round_trips_through_its_layer_code(monkeypatch):
    """A unit's call coded relative to its layer (splice.Coder.call) and decoded at the layer's own position is the
    call again, whatever its fields hold: the layer-relative ones through their codes, every other field of OpCall
    (one added later too) carried as it is — the hand-ordered tuple this replaced once dropped `where` (2064cf0)."""
    from dataclasses import fields, replace

    from opscan.trace import replicate
    from opscan.trace.records import OpCall
    from opscan.trace.splice import RELATIVE

    seen = {}
    real = replicate.replicate

    def spy(calls, groups, units, coder, first_free):
        seen.update(calls=calls, units=units, coder=coder)
        return real(calls, groups, units, coder, first_free)

    monkeypatch.setattr(replicate, "replicate", spy)
    scan(ScanOptions(f"{TARGETS}:build_model", args={"layers": 6}, fake=True, memory=False))
    calls, units, coder = seen["calls"], seen["units"], seen["coder"]
    carried = [f.name for f in fields(OpCall) if f.name not in (*RELATIVE, "index")]
    assert {"op", "phase", "attrs", "args_spec", "py", "caller", "where"} <= set(carried)
    layer1 = [(unit, calls[i]) for unit in (units.fwd[1], *units.bwd[1:2]) for i in unit]
    assert len(layer1) > 10 and any(c.node for _, c in layer1) and any(c.fx_node for _, c in layer1)
    for unit, call in layer1:
        marked = replace(call, **{name: ("marked", name) for name in carried})
        code = coder.call(marked, 1, unit)
        assert all(getattr(code, name) == getattr(marked, name) for name in carried)
        back, ins, outs = coder.decode(code, coder.full(1), lambda p: None if p is None else
                                       unit.start + p[1] if p[0] == "R" else p[1])
        rebuilt = replace(back, index=call.index, inputs=tuple(replace(t, storage=s) for t, s in ins),
                          outputs=tuple(replace(t, storage=s) for t, s in outs))
        assert rebuilt == marked
