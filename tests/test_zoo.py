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
        "known_wrong"}


def _zoo():
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_manifest_has_forty_real_architectures_in_a_reusable_shape():
    models = MANIFEST["models"]
    assert len(models) >= 40
    assert {e["source"] for e in models.values()} == {"torchvision", "timm", "transformers", "torch"}
    for name, entry in models.items():
        assert set(entry) <= KEYS, name
        entry = {**MANIFEST["defaults"], **entry}
        assert entry["mode"] in ("train", "inference") and (entry["mode"] == "train" or entry.get("why")), name
        assert entry["lane"] in ("mac-first", "dual-track", "linux-gpu-first"), name
        for key in entry.get("non_native", []):
            assert key in MANIFEST["reasons"], (name, key)  # every expected non-native row has its reason
        options = _zoo().options_of(entry)
        assert options.target and options.memory is False


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
