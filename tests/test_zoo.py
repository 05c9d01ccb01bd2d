"""The zoo (bench/zoo.yaml, bench/zoo.py): the manifest's shape, and the issue-14 models scanned through it.

Expected lanes come from MPS's own behaviour (docs/mps-view.md): torchvision's VisionTransformer calls
nn.MultiheadAttention with need_weights=False (attention nested in F.multi_head_attention_forward), CANINE hashes
its ids with `%` and LongT5 computes block ids with `%` and `//` on integer tensors (composites called with Python
scalars); all their ops have MPS kernels, so the step is mac-first.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = yaml.safe_load((ROOT / "bench" / "zoo.yaml").read_text(encoding="utf-8"))
KEYS = {"source", "target", "args", "inputs", "mode", "why", "dtype", "torch_version", "lane", "non_native",
        "known_wrong", "domain", "expected_before_run", "expectation_fixed", "known_wrong_rows", "known_missed_rows"}
LANES = ("mac-first", "dual-track", "linux-gpu-first")


def _zoo():
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_manifest_has_forty_real_architectures_in_a_reusable_shape():
    models = MANIFEST["models"]
    assert len(models) >= 40
    assert {e["source"] for e in models.values()} == {"torchvision", "timm", "transformers", "torch", "torch_geometric",
                                                      "e3nn", "torchdiffeq", "gpytorch", "zuko", "diffusers"}
    for name, entry in models.items():
        assert set(entry) <= KEYS, name
        entry = {**MANIFEST["defaults"], **entry}
        assert entry["mode"] in ("train", "inference") and (entry["mode"] == "train" or entry.get("why")), name
        assert entry["lane"] in LANES, name
        for key in entry.get("non_native", []):
            assert key in MANIFEST["reasons"], (name, key)  # every expected non-native row has its reason
        options = _zoo().options_of(entry)
        assert options.target and options.memory is False


def test_issue_25_domains_carry_their_expectation_at_2_14_1_and_before_2_5():
    # issue 25: at least 30 models from domains the zoo lacked, each with the lane and rows written before opscan
    # first ran on it (with their sources), scanned at 2.14.1 and at a release before 2.5
    models = MANIFEST["models"]
    new = {name: e for name, e in models.items() if "domain" in e}
    assert len({e["target"] + repr(e.get("args")) for e in new.values()}) >= 30
    assert len({e["domain"] for e in new.values()}) >= 10
    for name, entry in new.items():
        before = entry["expected_before_run"]
        assert before["lane"] in LANES and before["why"].strip(), name
        assert all(key in MANIFEST["reasons"] for key in before["non_native"]), name
        truth = ({**MANIFEST["defaults"], **entry}["lane"], sorted(entry.get("non_native", [])))
        assert truth == (before["lane"], sorted(before["non_native"])) or entry.get("expectation_fixed"), name
        for noted in ("known_wrong_rows", "known_missed_rows"):
            assert all(why.strip() for why in entry.get(noted, {}).values()), (name, noted)
        true = set(entry.get("non_native", []))
        assert set(entry.get("known_missed_rows", {})) <= true and not set(entry.get("known_wrong_rows", {})) & true
    releases = {e.get("torch_version") for e in new.values()}
    assert None in releases and any(r and tuple(map(int, r.split("."))) < (2, 5) for r in releases)


def test_the_issue_names_every_model_it_asks_for():
    models = MANIFEST["models"]
    assert "VisionTransformer" in (ROOT / "bench" / "zoo_models.py").read_text() and "vision_transformer" in models
    assert models["transformer_encoder_inference"]["mode"] == "inference"
    assert {"canine", "longt5"} <= set(models)
    assert models["lstm_proj"]["args"]["proj_size"] > 0
    assert models["unet3d_fp16"]["dtype"] == "float16"
    assert any(e.get("torch_version") == "2.3.0" for e in models.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vision_transformer", "canine", "longt5", "transformer_encoder_inference"])
def test_issue_models_are_native_and_mac_first(name):
    result = _zoo().run_one(name, {**MANIFEST["defaults"], **MANIFEST["models"][name]})
    assert result.error is None
    assert (result.non_native, result.lane) == ([], "mac-first")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm_proj", "unet3d_fp16", "vgg11_64px"])
def test_models_with_true_non_native_rows_match_the_manifest(name):
    # the in-kernel checks LSTM projections and float16 ConvTranspose3d (issue 15), VGG's adaptive pool at 64x64
    result = _zoo().run_one(name, {**MANIFEST["defaults"], **MANIFEST["models"][name]})
    assert result.problems == [] and result.lane != "mac-first"


@pytest.mark.slow
def test_the_2_3_0_attention_model_shows_no_cpu_flash_kernel():
    result = _zoo().run_one("bert_for_2_3_0", {**MANIFEST["defaults"], **MANIFEST["models"]["bert_for_2_3_0"]})
    assert not any("flash" in key for key in result.non_native)
    # _safe_softmax (the installed torch's math attention) is judged as the _softmax 2.3.0 ran (facts.yaml
    # earlier_paths, pytorch/pytorch#131844): every row native, as BERT on torch 2.3.0 runs on MPS
    assert result.non_native == [] and result.problems == [] and result.lane == "mac-first"


@pytest.mark.slow
def test_a_dtype_the_release_lacks_is_refused_by_views_and_copies_too():
    # issue 25's zoo: fno1d (a Fourier neural operator, complex64 spectral weights) predicted for torch 2.4.0 at its
    # minimum macOS 12.3, where MPS has no complex64 ('MPS complex types are only supported on MacOS 14.0 or
    # newer', facts.yaml dtype_limits). The metadata-only views (slice, transpose, _conj...) and copy_ of those
    # tensors were native (rules composite-metadata, mps-copy skipped the release's dtype limits): every row
    # with complex64 input is unsupported_dtype, and at macOS 14.0 no row is refused for the dtype
    entry = {**MANIFEST["defaults"], **MANIFEST["models"]["fno1d_for_2_4_0"]}
    from opscan.scan import scan

    options = _zoo().options_of(entry)
    complex_rows = [r for r in scan(options).rows if "complex64" in r.dtypes]
    assert {"aten::copy_", "aten::slice.Tensor", "aten::_conj"} <= {r.op.display for r in complex_rows}
    assert all((r.verdict.value, r.evidence.rule) == ("unsupported_dtype", "dtype-release") for r in complex_rows)
    from dataclasses import replace

    on_14 = scan(replace(options, macos="14.0")).rows
    assert not [r for r in on_14 if r.evidence.rule == "dtype-release"]


def test_known_wrong_rows_are_reported_not_counted_and_a_fix_is_noticed():
    zoo = _zoo()
    # `non_native` is the truth: it holds the missed row c too; b is predicted but not true
    entry = {"lane": "mac-first", "non_native": ["aten::a error", "aten::c unsupported"], "known_wrong": "pending",
             "known_wrong_rows": {"aten::b unsupported_dtype": "pending a fix"},
             "known_missed_rows": {"aten::c unsupported": "pending a fix"},
             "expected_before_run": {"lane": "mac-first", "non_native": ["aten::a error"], "why": "w"}}
    today = zoo.Result("m", entry, non_native=["aten::a error", "aten::b unsupported_dtype"], lane="dual-track")
    assert today.problems == [] and today.fixed == []
    assert today.expectation == "mac-first (run: dual-track): +aten::b unsupported_dtype"  # before the run: a only
    other = zoo.Result("m", entry, non_native=["aten::a error", "aten::d error"], lane="dual-track")
    assert other.problems == ["unexplained: aten::d error"]  # a row nobody noted still counts
    fixed = zoo.Result("m", entry, non_native=["aten::a error", "aten::c unsupported"], lane="mac-first")
    assert fixed.problems == [] and fixed.fixed == ["aten::b unsupported_dtype", "aten::c unsupported", "lane"]
    assert fixed.expectation == "mac-first: +aten::c unsupported"
    table = zoo.markdown([today, fixed], {"aten::a error": "why a", "aten::c unsupported": "why c"})
    assert "- `aten::a error`: why a" in table and "- `aten::c unsupported`: why c" in table
    assert "predicted `aten::b unsupported_dtype`, not true: pending a fix" in table
