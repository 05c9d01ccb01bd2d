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
BOUNDARIES = ("2.0.0", "2.1.0", "2.3.0", "2.3.1", "2.4.1", "2.5.0", "2.8.0", "2.9.0", "2.11.0", "2.12.0", "2.14.1")


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


def _needle(message: str) -> bytes:
    """The fixed part of a rule's message as the dylib stores it (the text before its first format argument or
    before "Falling back", without trailing dots)."""
    text = message.split("Falling back")[0].split("%s")[-1]
    return text.strip().rstrip(".").encode()


@pytest.mark.slow
@pytest.mark.skipif(not (DYLIBS / "2.14.1").is_dir(), reason="the releases' unpacked macOS wheels are not here")
@pytest.mark.parametrize("release", BOUNDARIES)
def test_each_message_is_in_the_dylib_of_exactly_the_releases_its_rules_cover(release):
    data = (DYLIBS / release / "torch" / "lib" / "libtorch_cpu.dylib").read_bytes()
    covered: dict[bytes, bool] = {}
    for rule in load_kernel_rules().fallbacks:
        covered[_needle(rule.message)] = covered.get(_needle(rule.message), False) or rule.releases.covers(release)
    assert {needle: needle in data for needle in covered} == covered


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
