"""Scale: a deep model's whole step is traced layer by layer, with fake tensors, never extrapolated.

examples/llama_big.py at the tiny width (hidden 64, 4 heads, 2 kv heads, intermediate 128, vocab
1000, batch 1 of 16 tokens), 2 and 32 decoder layers: every decoder layer runs the same calls in
forward, backward and AdamW, so the calls attributed to `model.layers.*` grow exactly 16x.
"""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import EXAMPLES
from opscan.knowledge import load_knowledge
from opscan.scan import ScanOptions, _fake_choice, run_trace
from opscan.target.load import load_target

SPEC = f"{EXAMPLES / 'llama_big.py'}:build_model"


def _layer_calls(layers: int) -> Counter:
    """Calls per (decoder layer index, phase)."""
    options = ScanOptions(SPEC, fake=True, fx=False)
    target = load_target(SPEC, {"size": "tiny", "layers": layers, "seq": 16}, [], _fake_choice(options))
    trace = run_trace(target, options, load_knowledge())
    return Counter((int(c.module.split(".")[2]), c.phase) for c in trace.findable()
                   if c.module.startswith("model.layers."))


def _per_phase(counts: Counter) -> Counter:
    out: Counter = Counter()
    for (_, phase), n in counts.items():
        out[phase] += n
    return out


@pytest.fixture(scope="module")
def two_and_thirty_two():
    return _layer_calls(2), _layer_calls(32)


def test_decoder_layer_calls_grow_16x(two_and_thirty_two):
    small, big = two_and_thirty_two
    assert {layer for layer, _ in small} == {0, 1}
    assert {layer for layer, _ in big} == set(range(32))  # every layer ran and was named: none extrapolated
    small, big = _per_phase(small), _per_phase(big)
    assert {"forward", "backward", "optimizer"} <= set(small)
    for phase in ("forward", "backward", "optimizer"):
        assert big[phase] == 16 * small[phase], phase


def test_every_layer_runs_the_same_step(two_and_thirty_two):
    _, big = two_and_thirty_two
    first = {phase: n for (layer, phase), n in big.items() if layer == 0}
    for layer in range(32):
        assert {phase: n for (i, phase), n in big.items() if i == layer} == first, layer
    # AdamW, per parameter: 2 zeros_like (its state) and 8 update calls (mul_ for weight decay, lerp_,
    # mul_, addcmul_, sqrt, div, add_, addcdiv_; the step counter's add_ and item() are no module's);
    # 9 parameters per layer (q, k, v, o, gate, up, down projections, two RMSNorm weights): 9 * 10 = 90
    assert first["optimizer"] == 90
