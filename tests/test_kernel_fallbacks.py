"""CPU fallbacks inside MPS kernels (kernel_rules.yaml `fallbacks`, rule `kernel-fallback-<id>`; issue 24).

Below macOS 13, torch 2.0-2.4's nearest-mode upsampling (and any upsampling given a scale factor) and nonzero run on
the CPU inside the MPS kernel (UpSample.mm check_mps_compatibility, Indexing.mm nonzero_fallback), whatever
PYTORCH_ENABLE_MPS_FALLBACK says; 2.5-2.8's nonzero does below macOS 14. A bool-mask index (`x[mask]`, its
backward `_index_put_impl_`) runs nonzero inside its kernel, below the trace: the MPS view adds that call (rule
`index-nonzero`). The dylib test re-reads the messages from the releases' libtorch_cpu.dylib where they are here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

from opscan.knowledge.kernel_rules import RULES_PATH, load_kernel_rules, parse_kernel_rules
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import TARGETS

ROOT = Path(__file__).resolve().parent.parent
TARGET = TARGETS / "kernel_fallbacks.py"
DYLIBS = Path(os.environ.get("OPSCAN_DYLIB_DIR", "/work/research/cxx/data"))
# the releases around each boundary the rules state (a series' first and last patch release where it has two)
BOUNDARIES = ("2.0.0", "2.0.1", "2.1.0", "2.2.0", "2.3.0", "2.3.1", "2.4.1", "2.5.0", "2.7.1", "2.8.0", "2.9.0",
              "2.11.0", "2.12.0", "2.13.0", "2.14.0", "2.14.1")


def _scan(name: str, release: str, macos: str | None = None):
    return scan(ScanOptions(f"{TARGET}:{name}", torch_version=release, macos=macos, memory=False, fx=False))


def _not_native(report) -> dict[str, tuple[str, str]]:
    return {r.op.display: (r.verdict.value, r.evidence.rule) for r in report.rows if r.verdict != Verdict.NATIVE}


def test_a_mask_index_and_nearest_upsampling_run_on_the_cpu_in_2_4_below_macos_13():
    report = _scan("mask_upsample", "2.4.0")  # 2.4.0's minimum macOS, 12.3
    assert _not_native(report) == {
        "aten::nonzero": ("cpu_fallback", "kernel-fallback-nonzero-macos-13"),
        "aten::upsample_nearest2d": ("cpu_fallback", "kernel-fallback-upsample-nearest-macos-13"),
        "aten::upsample_nearest2d_backward": ("cpu_fallback", "kernel-fallback-upsample-nearest-macos-13"),
    }
    nonzero = next(r for r in report.rows if r.op.display == "aten::nonzero")
    assert nonzero.cpu_op is not None and nonzero.cpu_op.display in ("aten::index.Tensor", "aten::_index_put_impl_")
    assert "supported natively starting from macOS 13.0" in nonzero.evidence.text
    assert "libtorch_cpu.dylib" in nonzero.evidence.source
    upsample = next(r for r in report.rows if r.op.display == "aten::upsample_nearest2d")
    assert "' mode upsampling is supported natively starting from macOS 13.0" in upsample.evidence.text
    assert report.lane.name.value != "mac-first"
    # the fallback copies the mask to the host and its 5 index rows back, forward and backward
    nonzero_moves = [n for n in report.transfers["ranking"] if n["op"] == "aten::nonzero"]
    assert [(n["d2h_bytes"], n["h2d_bytes"]) for n in nonzero_moves] == [(8, 40), (8, 40)]


@pytest.mark.parametrize(("release", "macos", "expected"), [
    ("2.4.0", "13.0", {}),
    ("2.6.0", None, {"aten::nonzero": ("cpu_fallback", "kernel-fallback-nonzero-macos-14")}),  # minimum: 13.0
    ("2.8.0", "13.5", {"aten::nonzero": ("cpu_fallback", "kernel-fallback-nonzero-macos-14")}),
    ("2.6.0", "14.0", {}),
    ("2.9.0", None, {}),
    ("2.14.1", None, {}),
])
def test_the_fallbacks_hold_for_their_releases_and_macos_only(release, macos, expected):
    report = _scan("mask_upsample", release, macos)
    assert _not_native(report) == expected
    assert any(r.op.display == "aten::nonzero" for r in report.rows)  # the mask's nonzero is a row in every release


def test_bilinear_upsampling_falls_back_with_a_scale_factor_not_with_a_size():
    assert _not_native(_scan("bilinear_scale", "2.4.0")) == {
        "aten::upsample_bilinear2d": ("cpu_fallback", "kernel-fallback-upsample-bilinear2d-scale-macos-13"),
        "aten::upsample_bilinear2d_backward": ("cpu_fallback",
                                               "kernel-fallback-upsample-bilinear2d-backward-scale-macos-13"),
    }
    assert _not_native(_scan("bilinear_size", "2.4.0")) == {}
    assert _not_native(_scan("bilinear_scale", "2.5.0")) == {}


@pytest.mark.parametrize(("release", "macos", "expected"), [
    ("2.4.0", None, {"aten::grid_sampler_2d": ("cpu_fallback", "kernel-fallback-grid-sampler-2d-macos-13-2"),
                     "aten::median": ("cpu_fallback", "kernel-fallback-median-macos-13")}),
    ("2.0.0", "13.1", {"aten::grid_sampler_2d": ("cpu_fallback", "kernel-fallback-grid-sampler-2d-2-0")}),
    ("2.7.0", None, {"aten::grid_sampler_2d": ("cpu_fallback", "kernel-fallback-grid-sampler-2d-macos-13-2")}),
    ("2.7.0", "13.2", {}),
    ("2.9.0", None, {}),
])
def test_grid_sampling_and_median_fall_back_where_their_kernels_say(release, macos, expected):
    found = _not_native(_scan("grid_median", release, macos))
    assert {op: v for op, v in found.items() if op in ("aten::grid_sampler_2d", "aten::median")} == expected


def test_a_fallback_must_name_real_releases_and_a_source():
    good = yaml.safe_load(Path(RULES_PATH).read_text(encoding="utf-8"))["fallbacks"][0]
    for bad in ({**good, "releases": ["2.4.x"]}, {**good, "source": " "}, {**good, "extra": 1}):
        with pytest.raises(ValueError):
            parse_kernel_rules(yaml.safe_dump({"fallbacks": [bad]}))
    assert parse_kernel_rules(yaml.safe_dump({"fallbacks": [good]})).fallbacks[0].releases.covers("2.4.1")


def _tool():
    path = ROOT / "tools" / "kernel_fallback_strings.py"
    spec = importlib.util.spec_from_file_location("kernel_fallback_strings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(not (DYLIBS / "2.14.1").is_dir(), reason="the releases' unpacked macOS wheels are not here")
@pytest.mark.parametrize("release", BOUNDARIES)
def test_each_message_is_in_the_dylib_of_exactly_the_releases_its_rules_cover(release):
    """The release's TORCH_WARN sites (tools/kernel_fallback_strings.py): every one is a rule's or explained, and each
    rule covers the release exactly when a warning of it is there (or none of its ops has an MPS kernel there)."""
    tool = _tool()
    held = {release: tool.warnings_of((DYLIBS / release / "torch" / "lib" / "libtorch_cpu.dylib").read_bytes())}
    rules = load_kernel_rules().fallbacks
    assert [m for m in held[release] if tool.classify(m, rules) == "UNACCOUNTED"] == []
    assert tool.rule_mismatches(rules, held, [release], tool._has_kernel) == []


def test_the_fallback_reader_classifies_warnings_by_rule_or_reason():
    tool = _tool()
    rules = load_kernel_rules().fallbacks
    assert tool.classify("torch.topk support for k>16 by MPS on MacOS 13+, please upgrade", rules) == \
        "rule topk-k16-macos-13"
    assert tool.classify(" supported by MPS on MacOS 13+, please upgrade", rules) == "rule cumulative-macos-13"
    assert tool.classify("torch.cumsum supported by MPS on MacOS 13+, please upgrade", rules) == \
        "rule cumsum-macos-13-2-0"  # not the 2.1-2.4 rule, whose message only ends the same
    assert tool.classify("MPS: median op is supported natively starting from macOS 13.0.  … Falling back on CPU. "
                         "This may have performace implications.", rules) == "rule median-macos-13"
    assert tool.classify("MPS: no support for int64 repeats mask, casting it to int32", rules).startswith(
        "not a fallback")
    assert tool.classify("MPS: frobnicate op is supported natively starting from macOS 16.0.  … Falling back on CPU.",
                         rules) == "UNACCOUNTED"
    sort = [r for r in rules if r.id == "sort-macos-13"]
    held = {"2.5.0": {"torch.sort is supported by MPS on MacOS 13+, please upgrade. Falling back to CPU": "Sort.mm"}}
    assert tool.rule_mismatches(sort, held, ["2.5.0"], lambda r, ops: True) == [
        "sort-macos-13: the dylibs of 2.5.0 hold its message, it covers -"]
    assert tool.rule_mismatches(sort, held, ["2.5.0"], lambda r, ops: False) == []  # no kernel there: another op's


def _zoo():
    spec = importlib.util.spec_from_file_location("zoo_bench_fallbacks", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(("name", "library", "rows"), [
    ("ddpm_unet_for_2_4_0", "diffusers",
     {"aten::upsample_nearest2d cpu_fallback", "aten::upsample_nearest2d_backward cpu_fallback"}),
    ("pyg_gcn_for_2_4_0", "torch_geometric", {"aten::nonzero cpu_fallback"}),
])
def test_the_zoos_2_4_0_models_show_the_fallbacks_they_meet(name, library, rows):
    pytest.importorskip(library)
    manifest = yaml.safe_load((ROOT / "bench" / "zoo.yaml").read_text(encoding="utf-8"))
    result = _zoo().run_one(name, {**manifest.get("defaults", {}), **manifest["models"][name]})
    assert result.error is None
    assert rows <= set(result.non_native)
    assert result.lane == "dual-track"
    assert result.problems == []


# ---------------------------------------------------------------- issue 38: the rest of the dylibs' fallbacks

@pytest.mark.parametrize(("name", "release", "macos", "expected"), [
    ("topk_sort_k32", "2.0.0", None, {"aten::topk": ("cpu_fallback", "kernel-fallback-topk-k16-macos-13"),
                                      "aten::sort.stable": ("cpu_fallback", "kernel-fallback-sort-macos-13")}),
    ("topk_sort_k16", "2.4.1", None, {"aten::sort.stable": ("cpu_fallback", "kernel-fallback-sort-macos-13")}),
    ("topk_sort_k32", "2.4.1", "13.0", {}),
    ("topk_sort_k32", "2.5.0", None, {}),  # 2.5.0's Sort.mm / Shape.mm have no CPU path (and min macOS is 12.3)
])
def test_sort_and_topk_above_16_run_on_the_cpu_in_2_0_to_2_4_below_macos_13(name, release, macos, expected):
    found = _not_native(_scan(name, release, macos))
    assert {op: v for op, v in found.items() if op in ("aten::topk", "aten::sort.stable")} == expected


def _fallback(op: str, values: tuple, release: str, macos: str | None = None, dtypes=("float32",)):
    from opscan.knowledge import load_knowledge
    from opscan.opkey import OpKey
    from opscan.predict.rules import predict_op
    from opscan.knowledge.signatures import load_signatures

    key = OpKey.parse(op)
    args = dict(zip((a.name for a in load_signatures().arguments(key.yaml_name, release)), values))
    found = predict_op(key, dtypes, load_knowledge(release=release, macos=macos), args=args)
    return found.verdict.value, found.evidence.rule


def test_each_new_fallback_on_both_sides_of_its_condition():
    from opscan.knowledge.conditions import TensorArg

    x = TensorArg("float32", (4, 8))
    assert _fallback("aten::cumsum", (x, 1, None), "2.0.0") == ("cpu_fallback",
                                                                "kernel-fallback-cumsum-macos-13-2-0")
    assert _fallback("aten::cumsum", (x, 1, None), "2.2.0") == ("cpu_fallback", "kernel-fallback-cumulative-macos-13")
    assert _fallback("aten::cumsum", (x, 1, None), "2.2.0", "13.0")[0] == "native"
    assert _fallback("aten::cumprod", (x, 1, None), "2.3.0") == ("cpu_fallback", "kernel-fallback-cumulative-macos-13")
    a = TensorArg("float32", (3, 3))
    assert _fallback("aten::linalg_inv_ex", (a, False), "2.7.0", "13.2") == (
        "cpu_fallback", "kernel-fallback-linalg-inv-ex-macos-13-3")  # the message says 13+, the check 13.3
    assert _fallback("aten::linalg_inv_ex", (a, False), "2.7.0", "13.3")[0] == "native"
    assert _fallback("aten::linalg_inv_ex", (a, False), "2.8.0", "13.0")[0] == "native"
    img = TensorArg("float32", (1, 8, 4, 4))
    assert _fallback("aten::pixel_shuffle", (img, 2), "2.3.0") == ("cpu_fallback",
                                                                  "kernel-fallback-pixel-shuffle-macos-13")
    assert _fallback("aten::pixel_shuffle", (img, 2), "2.5.0")[0] == "native"
    big, small = TensorArg("float32", (600, 600)), TensorArg("float32", (600, 512))
    assert _fallback("aten::linalg_qr", (big, "reduced"), "2.12.0") == ("cpu_fallback", "kernel-fallback-linalg-qr-512")
    assert _fallback("aten::linalg_qr", (small, "reduced"), "2.12.0")[0] == "native"
    assert _fallback("aten::linalg_qr", (big, "reduced"), "2.14.1")[0] == "native"
    longs = TensorArg("int64", (1, 1, 4, 4))
    pool = (longs, [2, 2], [2, 2], [0, 0], False, True)
    assert _fallback("aten::avg_pool2d", (*pool, 3), "2.14.1", dtypes=("int64",)) == (
        "cpu_fallback", "kernel-fallback-avg-pool2d-divisor-int64")
    assert _fallback("aten::avg_pool2d", (*pool, None), "2.14.1", dtypes=("int64",))[0] != "cpu_fallback"


def test_svd_and_eigh_of_2_14_stage_in_threadgroup_memory_or_run_on_the_cpu():
    from opscan.knowledge.conditions import TensorArg

    tiny = TensorArg("float32", (8, 8))  # 64 elements < 8192: the CPU, without a warning
    wide = TensorArg("float32", (256, 256))  # 256*256*4 bytes > 32 KiB: too large to stage
    fits = TensorArg("float32", (64, 64, 64))  # a batch of 64 64x64 matrices: 16 KiB each, 262144 elements
    assert _fallback("aten::_linalg_svd", (tiny, False, True, None), "2.14.1") == (
        "cpu_fallback", "kernel-fallback-svd-staging")
    assert _fallback("aten::_linalg_svd", (wide, False, True, None), "2.14.1")[1] == "kernel-fallback-svd-staging"
    assert _fallback("aten::_linalg_svd", (fits, False, True, None), "2.14.1")[0] != "cpu_fallback"
    eigh_fits = TensorArg("float32", (16, 32, 32))  # 2*32*32*4 = 8 KiB, 16384 elements
    assert _fallback("aten::_linalg_eigh", (eigh_fits, "L", True), "2.14.1")[0] != "cpu_fallback"
    assert _fallback("aten::_linalg_eigh", (tiny, "L", True), "2.14.1")[1] == "kernel-fallback-eigh-staging"
