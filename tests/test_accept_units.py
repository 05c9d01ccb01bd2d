"""`opscan accept` parts without a model run: the error measure, the spec, dropout neutralised, the train_step
path (examples/custom_step.py: autocast, clipping, SGD) and the rendered table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opscan.accept.compare import Comparison, compare_pair, errors
from opscan.accept.engine import AcceptOptions, accept
from opscan.accept.hooks import NoDropout, disable_dropout_modules
from opscan.accept.render import kind_rows
from opscan.accept.spec import DEFAULT_TOLERANCES, KINDS, SpecError, Tolerance, parse_spec

from conftest import EXAMPLES


def test_errors_are_rms_and_norm_relative_with_the_largest_element_kept():
    reference = torch.tensor([3.0, 4.0, 0.0, 0.0])
    target = torch.tensor([3.0, 4.0, 0.0, 2.0])
    rms, rel, biggest = errors(target, reference)
    assert (rms, rel, biggest) == (1.0, 0.4, 2.0)  # sqrt(4 / 4); 2 / ‖(3, 4)‖ = 2 / 5; |0 - 2|


def test_adam_sign_noise_on_a_few_elements_passes_a_real_change_does_not():
    torch.manual_seed(0)
    weight = torch.randn(256, 256) * 0.05
    noisy = weight.clone()
    noisy.view(-1)[:20] += 2e-3  # Adam's ±lr on 20 noise gradients whose sign differs (2·lr apart)
    tolerance = DEFAULT_TOLERANCES["float32"]["parameter"]
    assert compare_pair(1, "parameter", "w", "m", noisy, weight, tolerance).ok
    assert not compare_pair(1, "parameter", "w", "m", weight + 1e-3, weight, tolerance).ok


def test_nan_in_the_same_places_matches_and_on_one_side_fails():
    reference = torch.tensor([1.0, float("nan"), float("inf")])
    assert errors(reference.clone(), reference) == (0.0, 0.0, 0.0)
    assert errors(torch.tensor([1.0, 2.0, float("inf")]), reference) == (math.inf, math.inf, math.inf)
    assert errors(torch.ones(3), torch.ones(2)) == (math.inf, math.inf, math.inf)


def test_a_spec_merges_over_the_defaults_and_keeps_what_it_does_not_name():
    spec = parse_spec({"seed": 7, "tolerances": {"float16": {"loss": {"atol": 0.5}}}}, "s.yaml")
    assert spec.seed == 7 and spec.iterations == 3 and spec.source == "s.yaml"
    assert spec.tolerance("float16", "loss") == Tolerance(atol=0.5, rtol=DEFAULT_TOLERANCES["float16"]["loss"].rtol)
    assert spec.tolerance("float32", "loss") == DEFAULT_TOLERANCES["float32"]["loss"]
    assert DEFAULT_TOLERANCES["float16"]["loss"].atol == 1e-3  # the published defaults are not changed
    assert all(set(kinds) == set(KINDS) for kinds in DEFAULT_TOLERANCES.values())
    with pytest.raises(SpecError, match="unknown key 'float64' in tolerances"):
        parse_spec({"tolerances": {"float64": {}}}, "s.yaml")
    with pytest.raises(SpecError, match="seed is True"):
        parse_spec({"seed": True}, "s.yaml")


def test_dropout_is_neutralised_in_modules_functions_and_attention():
    x = torch.randn(2, 3, 8, 4)
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Dropout(0.0))
    assert disable_dropout_modules(model) == 1 and model[0].p == 0.0  # the p=0 one is not counted
    with NoDropout() as mode:
        assert torch.equal(F.dropout(x, 0.5, True), x)
        assert torch.equal(F.dropout(x, p=0.9, training=True), x)
        exact = F.scaled_dot_product_attention(x, x, x)
        assert torch.allclose(F.scaled_dot_product_attention(x, x, x, dropout_p=0.5), exact)
    assert mode.changed == 3


def test_a_target_with_its_own_train_step_is_compared_too():
    # examples/custom_step.py: train_step with autocast and clipping, SGD with momentum, returns the loss
    result = accept(AcceptOptions(f"{EXAMPLES}/custom_step.py:build_model", device="cpu", reference="cpu"))
    kinds = {c.kind for c in result.comparisons}
    assert kinds == {"initial", "output", "loss", "gradient", "parameter", "eval"} and result.exit_code == 0
    assert result.round_trip and result.round_trip_failure is None


def test_kind_rows_group_per_pair_and_kind_in_run_order():
    def row(kind, ok, rel, pair="target-vs-reference"):
        return Comparison(1, kind, "t", "m", rel / 10, rel, rel, 1e-5, 1e-3, ok, pair)

    rows = kind_rows((row("parameter", True, 1e-4), row("output", False, 2e-2), row("output", True, 1e-6),
                      row("reload", True, 0.0, "reload@target-vs-original")))
    assert [(r["pair"], r["kind"], r["compared"], r["failed"], r["worst_rel"]) for r in rows] == [
        ("target-vs-reference", "output", 2, 1, 2e-2), ("target-vs-reference", "parameter", 1, 0, 1e-4),
        ("reload@target-vs-original", "reload", 1, 0, 0.0)]
