"""One trace serves every release (opscan/zoo/releases.py, opscan/trace/questions.py): for every release the
knowledge base holds, `scan_releases` gives exactly the ReleaseResult of a whole `--torch-version R` scan (lane,
its reasons, every blocking row with its evidence), on real and crafted models, from as few traces as the
releases' answers to the trace's questions allow.

Where the traces part, and why (the knowledge base's release entries, opscan/knowledge/releases/*.txt):
- `_safe_softmax` is first declared in 2.5.0 (releases/2.5.0.txt `+op _safe_softmax E`: a CompositeExplicit-
  Autograd op without an MPS kernel, so the recorder expands it; facts.yaml: PR #131844 made attention's math path
  call it). A step that trains attention runs the math path on MPS, so 2.0.0-2.4.1 and 2.5.0+ answer "expand
  _safe_softmax?" differently: two traces.
- `_scaled_dot_product_attention_math_for_mps` is first declared in 2.5.0 (releases/2.5.0.txt `... M`): attention
  with no grad and contiguous q/k/v asks whether the release has it (lens.py mps-sdpa): two traces.
- every release declares `linear`, `max_pool2d` and `_lstm_mps` with MPS kernels (releases/2.0.0.txt
  `+op _lstm_mps M`, the base entry the later ones patch), and a trained attention never asks for the sdpa
  kernel (grad needed: MPS takes the math path whatever the release), so a CNN or an LSTM takes one trace.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from opscan.knowledge import kb_releases
from opscan.scan import ScanOptions, scan
from opscan.zoo.releases import result_of, scan_releases

from conftest import REPO, TARGETS

BENCH = REPO / "bench" / "zoo_models.py"
RELEASES_PY = TARGETS / "releases.py"
BERT = {"arch": "BertForMaskedLM", "seq": 8, "vocab": 64,  # one layer, 8 tokens: the same ops as a full BERT
        "config": {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "intermediate_size": 32, "max_position_embeddings": 16}}
BEFORE_25 = ("2.0.0", "2.0.1", "2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1", "2.4.0",
             "2.4.1")

# name: (options, the traces expected, which releases share the first trace). The CNN is built and traced with
# fake tensors (as the zoo does for a model too big for RAM): the same calls as the real trace without its
# parameters' arithmetic, which makes its 27 yardstick scans cheap; the others run on real tensors.
RESNET18 = ScanOptions("torchvision.models:resnet18", inputs=("2x3x32x32:float32",), args={"num_classes": 10},
                       fake=True, fx=False)
MODELS = {
    "mobilenet_v3_small": (ScanOptions("torchvision.models:mobilenet_v3_small", inputs=("2x3x32x32:float32",),
                                       args={"num_classes": 10}, fake=True, fx=False), 1, None),
    "vit": (ScanOptions(f"{BENCH}:vision_transformer", fx=False), 2, BEFORE_25),  # nn.MultiheadAttention
    "bert": (ScanOptions(f"{BENCH}:hf", args=BERT, fx=False), 2, BEFORE_25),  # sdpa attention, trained
    "lstm": (ScanOptions(f"{BENCH}:lstm", fx=False), 1, None),
    "trained_attention": (ScanOptions(f"{RELEASES_PY}:trained_attention", fx=False), 2, BEFORE_25),
}


def _per_release(options: ScanOptions, releases) -> dict:
    """The yardstick: one whole scan per release, as `opscan --torch-version R` makes it (memory off)."""
    return {r: result_of(scan(replace(options, torch_version=r, memory=False)), r) for r in releases}


@pytest.fixture(scope="module", params=sorted(MODELS))
def judged(request):
    options, traces, first = MODELS[request.param]
    return request.param, scan_releases(options), _per_release(options, kb_releases()), traces, first


def test_every_release_equals_its_own_scan(judged):
    name, new, old, _, _ = judged
    assert tuple(new) == kb_releases()
    for release in kb_releases():
        assert new[release] == old[release], (name, release)
        assert new[release].to_dict() | {"trace": 0, "traces": 1, "trace_seconds": 0.0} == old[release].to_dict()


def test_results_read_back_from_json(judged):
    import json

    from opscan.zoo.releases import ReleaseResult

    _, new, _, _, _ = judged
    for found in new.values():
        back = ReleaseResult.from_dict(json.loads(json.dumps(found.to_dict())))
        assert back == found and back.to_dict() == found.to_dict()
        assert (back.trace, back.traces) == (found.trace, found.traces)


def test_one_trace_per_set_of_equal_answers(judged):
    name, new, _, traces, first = judged
    assert {r.traces for r in new.values()} == {traces}, name
    shared = tuple(r for r, found in new.items() if found.trace == 0)
    assert shared == (first or kb_releases()), name
    assert all(found.trace_seconds > 0 for found in new.values())


def test_the_releases_do_differ_where_the_knowledge_base_says(judged):
    # the comparison means something only if the releases' results differ: MobileNetV3's hardsigmoid has no MPS
    # kernel in 2.0.x (releases/2.0.0.txt `+op hardsigmoid.out -`; releases/2.1.0.txt `+op hardsigmoid.out M`), so
    # it is blocked there and native from 2.1.0. The other models run natively from 2.0.0: their AdamW step is
    # judged as torch 2.0's own code ran it, mul_ + add_ (facts.yaml earlier_paths, torch/optim/adamw.py:389 of
    # the 2.0.0 wheel), not lerp_ (no MPS kernel in 2.0.x), and nothing else of theirs lacks a 2.0 kernel
    name, new, _, _, _ = judged
    if name == "mobilenet_v3_small":
        assert {b.op for b in new["2.0.0"].blocking} == {"aten::hardsigmoid", "aten::hardsigmoid_backward"}, name
        assert new["2.0.0"].lane != new["2.14.1"].lane or new["2.0.0"].lane_why != new["2.14.1"].lane_why, name
    elif name == "lstm":  # 2 layers: 2.0's _lstm_mps refuses them below macOS 13 (RnnOps.mm, kc-a011f6a7; from 2.1
        # RNN.cpp runs them as LSTMCell steps instead), and 2.0.0's minimum macOS is 12.3
        assert {(b.op, b.rule) for b in new["2.0.0"].blocking} == {
            ("aten::_lstm_mps", "kernel-lstm-multilayer-macos-13")}, name
        assert (new["2.1.0"].lane, new["2.14.1"].lane, new["2.14.1"].blocking) == ("mac-first", "mac-first", ()), name
    else:
        assert "aten::lerp_.Scalar" not in {b.op for b in new["2.0.0"].blocking}, name
        assert (new["2.0.0"].lane, new["2.0.0"].blocking) == (new["2.14.1"].lane, new["2.14.1"].blocking) == \
            ("mac-first", ()), name


def test_resnet18_is_native_from_2_0_and_the_one_trace_says_so():
    # torch 2.0.x AdamW: exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) (the 2.0.0 wheel's torch/optim/adamw.py:389,
    # facts.yaml earlier_paths), both with MPS kernels in 2.0.0; lerp_ (no MPS kernel before 2.1.0) came with 2.1.0
    options = replace(RESNET18, fake=False, fx=True)  # real tensors and fx node tags this time
    new = scan_releases(options, ("2.0.1", "2.1.0", "2.14.1"))
    assert [r.lane for r in new.values()] == ["mac-first", "mac-first", "mac-first"]
    assert new["2.0.1"].blocking == () and new["2.0.1"].native
    assert {r.traces for r in new.values()} == {1}


@pytest.mark.parametrize("target, inference, releases, traces", [
    # attention without grad: the lens asks for the sdpa kernel (2.5.0+), the view differs at 2.5.0
    ("attention", True, ("2.4.1", "2.5.0", "2.14.1"), (0, 1, 1)),
    # CTC: _ctc_loss got its MPS kernel in 2.14.0 (releases/2.14.1.txt `+op _ctc_loss M`); one trace, two lanes
    ("ctc", False, ("2.0.0", "2.13.0", "2.14.1"), (0, 0, 0)),
])
def test_crafted_release_boundaries(target, inference, releases, traces):
    options = ScanOptions(f"{RELEASES_PY}:{target}", inference=inference, fx=False)
    new = scan_releases(options, releases)
    assert new == _per_release(options, releases)
    assert tuple(r.trace for r in new.values()) == traces


def test_a_release_answering_a_question_differently_gets_its_own_trace():
    from opscan.opkey import OpKey
    from opscan.trace.questions import Questions, answers_equal

    linear = OpKey("aten", "linear")
    asked = Questions(lambda op: op == linear, macos=(14, 0))
    assert asked.has_kernel(linear) and not asked.macos_at_least((15, 0))
    assert asked.asked() == ((("kernel", linear), True), (("macos-at-least", (15, 0)), False))
    assert answers_equal(asked.asked(), Questions(lambda op: True, macos=(14, 4)))  # unasked ops do not matter
    assert not answers_equal(asked.asked(), Questions(lambda op: False, macos=(14, 0)))
    assert not answers_equal(asked.asked(), Questions(lambda op: True, macos=(15, 0)))


def test_a_real_tensor_try_never_switches_to_fake_tensors(monkeypatch):
    """The zoo's real-tensor try is for models whose step fake tensors cannot finish (detectors): switching to fake
    ones because free RAM looked short traced them only up to detector.transform (9 rows of ~140, the 2026-12-03
    re-publish on a loaded 2-core machine). With every footprint "too big", the real try stays real."""
    from opscan.zoo.models import ZooModel
    from opscan.zoo.task import options_for, run_model

    monkeypatch.setattr("opscan.trace.fake.RAM_FRACTION", 0.0)  # any step now looks too big for the RAM
    model = ZooModel("mlp", f"{TARGETS / 'zoo_tiny.py'}:mlp", fake="false")
    assert options_for(model, False).auto_fake is False
    found = run_model(model.to_dict(), ("2.14.1",))
    real = result_of(scan(ScanOptions(model.target, auto_fake=False, memory=False, fx=False)), "2.14.1")
    assert found["fake"] is False and found["cells"][0]["rows"] == real.rows
