"""Tests of the shipped knowledge base: one entry per torch release 2.0.0 … 2.14.1 (opscan/knowledge/releases)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import opscan.knowledge.loader as loader
from opscan.knowledge import KnowledgeError, installed_release, kb_releases, load_knowledge
from opscan.knowledge.build import BACKENDS_MPS, COMMON_MPS, VERSION, YAML, plan_entry, read_installed, read_wheel
from opscan.knowledge.entry import RELEASES_DIR, counts_line, load_store, parse_entry
from opscan.knowledge.facts import load_facts
from opscan.knowledge.sources import common_mps_records, python_registrations
from opscan.opkey import OpKey, Release

K = OpKey.parse
INSTALLED = installed_release()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORE = load_store()
OWN = [line.entry for line in STORE.index if line.entry == f"{line.release}.txt"]
# Every torch release on PyPI from 2.0.0 to 2.14.1 (pip index versions torch, 2026).
ALL_RELEASES = ("2.0.0 2.0.1 2.1.0 2.1.1 2.1.2 2.2.0 2.2.1 2.2.2 2.3.0 2.3.1 2.4.0 2.4.1 2.5.0 2.5.1 2.6.0 2.7.0 "
                "2.7.1 2.8.0 2.9.0 2.9.1 2.10.0 2.11.0 2.12.0 2.12.1 2.13.0 2.14.0 2.14.1").split()


def test_every_release_is_covered_and_each_series_has_its_own_entry():
    assert kb_releases() == tuple(ALL_RELEASES)
    own = {e.removesuffix(".txt") for e in OWN}
    assert own == {f"2.{m}.0" for m in range(14)} | {"2.14.1"}  # the x.y.0 releases of mps_facts §0 + 2.14.1
    for line in STORE.index:  # a shared entry is always of the same series (records equal: build.py)
        assert Release.parse(line.entry.removesuffix(".txt")).series == Release.parse(line.release).series
    assert STORE.line("2.14.0").entry == "2.14.1.txt"  # 2.14.0's yaml differs from 2.14.1's only in a kernel name
    assert STORE.line("2.14.0").yaml_sha != STORE.line("2.14.1").yaml_sha


def test_the_knowledge_base_is_small():
    size = sum(os.path.getsize(os.path.join(RELEASES_DIR, f)) for f in os.listdir(RELEASES_DIR))
    assert size < 400_000, size  # 15 entries: one full (2.0.0, ~90 kB) and 14 deltas
    assert os.path.getsize(os.path.join(RELEASES_DIR, "2.14.1.txt")) < 20_000


_RECORD = re.compile(r"^(op [\w.]+ (-|M?S?C?I?i?E?N?)( [<^][\w.]+)?|py [\w.]+|complex \w+ \S+|"
                     r"xfail \w+ \S+ (\*|[a-z0-9,]+)( macos(<|>=)\d+\.\d+)?|note \w+ \S+ \S.*\S)$")


@pytest.mark.parametrize("name", OWN)
def test_each_entry_is_internally_consistent(name):
    entry = STORE.entry(name)
    records = STORE.records(name)  # the base chain applies (no removal of a missing record, no re-adding)
    assert entry.release == name.removesuffix(".txt")
    assert entry.base is None or Release.parse(entry.base) < Release.parse(entry.release)
    assert dict(entry.header)["counts"] == counts_line(records)
    assert all(_RECORD.match(r) for r in records), [r for r in records if not _RECORD.match(r)][:3]
    ops = {r.split(" ")[1]: r.split(" ") for r in records if r.startswith("op ")}
    refs = [f[3][1:] for f in ops.values() if len(f) > 3]
    assert set(refs) <= set(ops)  # every structured_delegate / autogen origin is declared
    assert {r[3:] for r in records if r.startswith("py ")} <= set(ops)
    has_common = any(r.startswith("xfail ") for r in records)
    assert has_common == (Release.parse(entry.release).numbers >= (2, 8)) == ("common_mps.py" in entry.sha256())
    assert STORE.line(entry.release).yaml_sha == entry.sha256()["native_functions.yaml"][:12]


def test_mps_kernel_counts_per_release():
    counts = {r: load_knowledge(release=r).yaml.mps_counts() for r in ("2.0.0", "2.8.0", "2.13.0", "2.14.1")}
    assert counts == {"2.0.0": (307, 228), "2.8.0": (475, 338), "2.13.0": (533, 357), "2.14.1": (549, 363)}


def test_python_registrations_match_the_hand_kept_facts():
    facts = load_facts()
    for release in kb_releases():
        parsed = set(load_knowledge(release=release).facts.python_registrations)
        hand_kept = set(dict(facts.sections["python_registrations"][Release.parse(release).series]))
        assert parsed == hand_kept, release


# When an overload first got an MPS kernel, read from the wheels' own native_functions.yaml: (overload,
# the last release without, the first with, the dispatch line of the first wheel's yaml).
FIRST_KERNELS = [
    ("_ctc_loss", "2.13.0", "2.14.0", "MPS: ctc_loss_mps"),
    ("grid_sampler_3d", "2.8.0", "2.9.0", "MPS: grid_sampler_3d_mps"),
    ("_upsample_bicubic2d_aa.out", "2.7.0", "2.8.0", "MPS: _upsample_bicubic2d_aa_out_mps"),
    ("isin.Tensor_Tensor_out", "2.3.0", "2.4.0", "MPS: isin_Tensor_Tensor_out_mps"),
    ("isin.Tensor_Tensor", "2.3.0", "2.4.0", "structured_delegate: isin.Tensor_Tensor_out"),
    ("_fused_rms_norm", "2.7.0", "2.8.0", "MPS: _fused_rms_norm_mps"),
    ("native_group_norm", "2.12.0", "2.13.0", "CPU, CUDA, MPS: native_group_norm"),
    ("var_mean.correction", "2.2.0", "2.3.0", "MPS: var_mean_mps"),
    ("_linalg_svd.U", "2.13.0", "2.14.0", "CPU, CUDA, MPS: _linalg_svd_out"),
    ("_cdist_backward", "2.12.0", "2.13.0", "CPU, CUDA, MPS: _cdist_backward"),
    ("angle", "2.6.0", "2.7.0", "MPS: angle_mps"),
    ("cholesky", "2.6.0", "2.7.0", "MPS: cholesky_mps"),
    ("_fused_adam_", "2.4.0", "2.5.0", "MPS: _fused_adam_kernel_mps_"),
    ("histc", "2.0.0", "2.1.0", "CPU, MPS: histogram_histc"),
    ("searchsorted.Tensor", "2.1.0", "2.2.0", "MPS: searchsorted_mps"),
    ("kthvalue.values", "2.8.0", "2.9.0", "MPS: kthvalue_out_mps"),
    ("im2col", "2.5.0", "2.6.0", "MPS: im2col_mps"),
    ("col2im", "2.7.0", "2.8.0", "MPS: col2im_mps"),
    ("_scaled_dot_product_attention_math_for_mps", "2.4.0", "2.5.0", "MPS: _scaled_dot_product_attention_math_mps"),
    ("_weight_int4pack_mm", "2.3.0", "2.4.0", "MPS: _weight_int4pack_mm_mps"),
    ("_embedding_bag", "2.9.0", "2.10.0", "MPS: _embedding_bag_mps"),
    ("_fft_r2c", "2.2.0", "2.3.0", "MPS: _fft_r2c_mps"),
    ("linalg_qr.out", "2.11.0", "2.12.0", "MPS: linalg_qr_out_mps"),
    ("max_unpool2d", "2.8.0", "2.9.0", "MPS: max_unpooling2d_forward_mps"),
    ("index_reduce.out", "2.11.0", "2.12.0", "MPS: index_reduce_mps_out"),
    ("poisson", "2.13.0", "2.14.0", "MPS: _s_poisson_mps"),
]


@pytest.mark.parametrize("op, before, first, source", FIRST_KERNELS, ids=[f[0] for f in FIRST_KERNELS])
def test_when_an_overload_first_got_an_mps_kernel(op, before, first, source):
    """Source: the dispatch line of native_functions.yaml in the `first` release's macOS wheel, absent in `before`."""
    key = OpKey.from_yaml(op)
    assert load_knowledge(release=before).yaml.mps_kernel(key) is None
    assert load_knowledge(release=first).yaml.mps_kernel(key) is not None
    later = [r for r in kb_releases() if Release.parse(r) >= Release.parse(first)]
    kept = [bool(load_knowledge(release=r).yaml.mps_kernel(key)) for r in later]
    assert all(kept) or op == "cholesky"  # torch.cholesky left native_functions.yaml in 2.14.0


def test_always_cpu_ops_leave_the_list_when_they_get_a_kernel():
    # mps_facts §1.2 (dylib) and the yaml (wheel) agree: im2col leaves the always-CPU list in 2.6, col2im in 2.8.
    for op, first in (("im2col", "2.6.0"), ("col2im", "2.8.0")):
        previous = kb_releases()[kb_releases().index(first) - 1]
        assert K(op) in load_knowledge(release=previous).facts.always_cpu
        assert K(op) not in load_knowledge(release=first).facts.always_cpu


def test_release_selection_and_what_if():
    kb = load_knowledge(release="2.13.0")
    assert (kb.origin, kb.entry, kb.yaml_release, kb.macos) == ("kb", "2.13.0.txt", "2.13.0", (14, 0))
    assert "2.13.0" in kb.yaml_source and kb.common_mps is not None
    old = load_knowledge(release="2.7.1")  # a patch release shares its series' entry
    assert (old.entry, old.release, old.macos, old.common_mps) == ("2.7.0.txt", "2.7.1", (13, 0), None)
    assert load_knowledge(release="2.5.0", macos="15.2").macos == (15, 2)
    assert load_knowledge(release="2.5.0").macos_source.startswith("the release's minimum")


def test_a_release_newer_than_the_knowledge_base_is_built_live(monkeypatch):
    monkeypatch.setattr(loader, "installed_release", lambda: "2.99.0")
    try:
        kb = load_knowledge(release="2.99.0")
        assert kb.origin == "live" and kb.entry is None and kb.yaml.mps_counts() == read_live_counts()
        assert any("built live from the installed wheel" in n for n in kb.notes)
        assert any("of 2.14 are assumed [INF]" in n for n in kb.notes)
    finally:
        loader._load.cache_clear()
        monkeypatch.undo()
    with pytest.raises(KnowledgeError, match="install torch 2.99.0"):
        load_knowledge(release="2.99.0")


def read_live_counts():
    """MPS counts of the installed wheel's own files."""
    from opscan.knowledge.optable import OpTable

    return OpTable.from_records(read_installed().records(), "x", "x").mps_counts()


# --- tools/build_kb.py ----------------------------------------------------------------------------


@pytest.mark.skipif(STORE.line(INSTALLED or "-") is None, reason=f"torch {INSTALLED} has no shipped entry")
def test_build_reproduces_the_installed_release_entry_byte_for_byte():
    plan = plan_entry(INSTALLED, read_installed(), STORE)  # no network: the installed wheel's files
    with open(os.path.join(RELEASES_DIR, plan.entry_name), encoding="utf-8") as fh:
        assert plan.entry_text == fh.read()
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "build_kb.py"), INSTALLED, "--installed",
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0 and "matches the rebuilt entry" in done.stdout, done.stderr


def _fake_wheel(path) -> str:
    """A zip laid out like a torch wheel, holding the installed torch's four files."""
    files = read_installed()
    with zipfile.ZipFile(path, "w") as zf:
        for name in (YAML, BACKENDS_MPS, COMMON_MPS, VERSION):
            if files.text(name) is not None:
                zf.writestr(name, files.text(name))
    return str(path)


def test_build_tool_writes_a_new_release_and_shares_equal_records(tmp_path):
    kb_dir = tmp_path / "releases"
    shutil.copytree(RELEASES_DIR, kb_dir)
    wheel = _fake_wheel(tmp_path / "torch-2.99.0-cp311-cp311-macosx_14_0_arm64.whl")
    assert read_wheel(wheel).records() == read_installed().records()
    tool = [sys.executable, os.path.join(REPO, "tools", "build_kb.py")]
    for release in ("2.99.0", "2.99.1"):
        done = subprocess.run([*tool, release, "--wheel", wheel, "--kb-dir", str(kb_dir)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    entry = parse_entry((kb_dir / "2.99.0.txt").read_text())
    assert entry.base == kb_releases()[-1] and not (kb_dir / "2.99.1.txt").exists()
    index = (kb_dir / "index.txt").read_text()
    assert "\n2.99.0 2.99.0.txt yaml=" in index and "\n2.99.1 2.99.0.txt yaml=" in index
    check = subprocess.run([*tool, "2.99.0", "--wheel", wheel, "--kb-dir", str(kb_dir), "--check"])
    assert check.returncode == 0


def test_python_registrations_are_parsed_with_ast():
    text = ('from torch.library import Library as _Library\n_lib = _Library("aten", "IMPL")\n'
            '_lib.impl("native_group_norm", f, "MPS")\n_lib.impl("other", f, "CPU")\n')
    assert python_registrations(text) == ["native_group_norm"]


def test_common_mps_conditions_are_kept():
    text = '''
def mps_ops_modifier(ops):
    UNIMPLEMENTED_XFAILLIST = {
        "take": None,
        "dot": [torch.int64] if MACOS_VERSION < 14.0 else [],
        "amax": [torch.int32, torch.int64] if MACOS_VERSION < 15.0 else [torch.int64],
        "take": [torch.bool],
    }
    if MACOS_VERSION < 14.0:
        UNIMPLEMENTED_XFAILLIST.update({"fft.fft": None})
    SUPPORTED_COMPLEX_OPS = {"add", "mul"}
'''
    assert sorted(common_mps_records(text)) == [
        "complex SUPPORTED_COMPLEX_OPS add", "complex SUPPORTED_COMPLEX_OPS mul",
        "xfail UNIMPLEMENTED_XFAILLIST amax int32,int64 macos<15.0",
        "xfail UNIMPLEMENTED_XFAILLIST amax int64 macos>=15.0",
        "xfail UNIMPLEMENTED_XFAILLIST dot int64 macos<14.0",
        "xfail UNIMPLEMENTED_XFAILLIST fft.fft * macos<14.0",
        "xfail UNIMPLEMENTED_XFAILLIST take bool",  # a repeated key: the last one wins, as in Python
    ]
    from opscan.knowledge.common_mps import CommonMps

    lists = CommonMps("x", frozenset(common_mps_records(text)))
    at13, at15 = lists.xfail("UNIMPLEMENTED_XFAILLIST", (13, 0)), lists.xfail("UNIMPLEMENTED_XFAILLIST", (15, 0))
    assert at13 == {"take": ("bool",), "dot": ("int64",), "amax": ("int32", "int64"), "fft.fft": None}
    assert at15 == {"take": ("bool",), "amax": ("int64",)}
    assert lists.gate_of("UNIMPLEMENTED_XFAILLIST", "fft.fft", (13, 0)) == "14.0"


def test_opinfo_map_methods_and_what_it_cannot_map():
    omap = load_knowledge(release="2.14.1").opinfo
    methods = {}
    for row in omap.rows.values():
        methods[row.method] = methods.get(row.method, 0) + 1
    # 6 convolution OpInfos moved from none to samples: their MPS-view op per input rank (_mps_convolution@4, ...)
    assert omap.release == "2.14.1" and methods == {"name": 368, "samples": 105, "none": 230}
    assert omap.rows["nn.functional.conv_transpose3d"].overloads == ("_mps_convolution_transpose@5",)
    assert omap.rows["nn.functional.linear"].overloads == ("linear",)  # a CIA op with an MPS kernel, by name
    assert omap.rows["nn.functional.avg_pool1d"].overloads == ("avg_pool2d",)  # by samples, sharing a word
    assert omap.rows["nn.functional.local_response_norm"].method == "none"  # its avg_pool2d is not its own
    # keys of the 2.8-2.14.1 lists whose OpInfo 2.14.1's op_db lacks: their expectations reach no op
    keys = {r.split(" ")[2] for release in kb_releases() if Release.parse(release).numbers >= (2, 8)
            for r in load_knowledge(release=release).common_mps.records}
    assert sorted(keys - set(omap.rows)) == [
        "_segment.reduce", "_segment_reduce", "_segment_reduce_lengths", "_segment_reduce_offsets",
        "_upsample_bicubic2d_aa", "cauchy_", "div", "geometric_", "log_normal_", "masked.scatter", "mat",
        "nn.functional.norm", "qr", "segment.reduce", "segment_reduce", "segment_reduce_",
        "segment_reduce_offsets", "sparse.mm", "symeig"]
