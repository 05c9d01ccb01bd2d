"""Issue 25's five mechanism classes, each on a real model of its kind (tests/targets/mechanisms.py):
complex FFT through the OpInfo map, expectations applied only under their stated condition, the fx
pre-pass leaving the user's objects as they were, sparse layouts never judged as dense, composites
decided when no callee can be native."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from opscan.scan import ScanOptions, scan
from opscan.trace import fxnodes
from opscan.verdict import Verdict

from conftest import TARGETS

MECH = TARGETS / "mechanisms.py"


def _options(name: str, **kw) -> ScanOptions:
    return ScanOptions(f"{MECH}:{name}", **kw)


def _load(name: str):
    spec = importlib.util.spec_from_file_location("mechanisms_under_test", MECH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


def _rows(report):
    return {(r.op.display, tuple(r.dtypes), r.verdict.value) for r in report.rows if r.verdict != Verdict.NATIVE}


# --- 3. the fx pre-pass never touches the user's objects -------------------------------------------


def _state(obj, path="model", seen=None, out=None):
    """Every attribute binding and container item reachable from `obj`, by path: the identity of
    tensors and objects, the value of plain data (an independent walk, not opscan's)."""
    seen = set() if seen is None else seen
    out = {} if out is None else out
    if isinstance(obj, (int, float, str, bool, type(None), torch.dtype, torch.device)):
        out[path] = ("value", obj)
        return out
    out[path] = (type(obj).__name__, id(obj))
    if id(obj) in seen or isinstance(obj, (torch.Tensor, type)) or callable(obj) and not hasattr(obj, "__dict__"):
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    else:
        items = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for key, value in items:
        _state(value, f"{path}.{key}", seen, out)
    return out


@pytest.mark.parametrize("target", ["diffusion", "diffusers_ddpm"])
def test_symbolic_tracing_leaves_the_model_and_its_helpers_as_they_were(target):
    if target == "diffusers_ddpm":
        pytest.importorskip("diffusers")
    model, _ = _load(target)
    before = _state(model)
    rng = torch.get_rng_state()
    graph, info = fxnodes.symbolic(model)
    after = _state(model)
    assert graph is None and "'len' is not supported" in info.reason  # the pre-pass did run into the scheduler
    assert after == before
    assert isinstance(model.scheduler.alphas_cumprod, torch.Tensor)  # not a Proxy
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_successful_trace_leaves_cached_state_alone():
    """A forward that caches on itself and is traceable: the graph is kept, the cache is not a Proxy."""

    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.cache = None
            self.seen = []
            self.extra = {"hits": 0}

        def forward(self, x):
            self.cache = self.linear(x)
            self.seen.append(self.cache)
            self.extra["last"] = self.cache
            return self.cache.relu()

    model = Caching()
    before = _state(model)
    graph, info = fxnodes.symbolic(model)
    assert graph is not None and info.traced
    assert _state(model) == before and model.cache is None and model.seen == [] and model.extra == {"hits": 0}


@pytest.mark.parametrize("target", ["diffusion", "diffusers_ddpm"])
def test_a_model_with_a_scheduler_scans_as_with_no_fx(target):
    if target == "diffusers_ddpm":
        pytest.importorskip("diffusers")
    with_fx = scan(_options(target))
    without = scan(_options(target, fx=False))
    assert not with_fx.trace["fx"]["traced"]
    assert [(r.op, r.dtypes, r.verdict, r.calls) for r in with_fx.rows] == \
        [(r.op, r.dtypes, r.verdict, r.calls) for r in without.rows]
    assert with_fx.lane.name == "mac-first"


# --- 1. complex FFT: the OpInfo map records what complex64 samples dispatch -------------------------


def test_a_spectral_layer_in_complex64_is_native_where_the_list_says_so():
    """FNO's spectral conv: rfft2 -> complex64 channel mixing -> irfft2. common_mps.py 2.14.1 lists
    fft.irfft2, fft.fft, ... as complex-supported, and their complex64 samples dispatch _fft_c2r/_fft_c2c."""
    report = scan(_options("spectral"))
    assert _rows(report) == set()
    assert report.lane.name == "mac-first"
    fft = {r.op.name: r for r in report.rows if r.op.name.startswith("_fft_")}
    assert set(fft) == {"_fft_r2c", "_fft_c2r", "_fft_c2c"} and fft["_fft_c2r"].dtypes == ("complex64",)


def test_the_map_records_the_complex64_dispatch_of_fft_opinfos():
    from opscan.knowledge import load_knowledge
    from opscan.predict.rules import predict_op
    from opscan.opkey import OpKey

    kb = load_knowledge(release="2.14.1")
    assert "_fft_c2r" in kb.opinfo.rows["fft.irfft2"].dispatched["complex64"]
    assert "_fft_c2c" in kb.opinfo.rows["fft.ifft"].dispatched["complex64"]
    assert kb.opinfo.rows["fft.irfft2"].overloads == ()  # its float32 samples carry no expectation
    c2r = predict_op(OpKey.parse("aten::_fft_c2r"), ("complex64",), kb)
    assert c2r.verdict is Verdict.NATIVE
    # 2.8.0 lists the FFT OpInfos in AFTER_MACOS_14_0_SUPPORTED_COMPLEX_OPS (below macOS 14, complex64
    # itself is missing: facts.yaml's dtype limit decides first)
    old = predict_op(OpKey.parse("aten::_fft_c2r"), ("complex64",), load_knowledge(release="2.8.0", macos="13.0"))
    assert old.verdict is Verdict.UNSUPPORTED_DTYPE
    assert predict_op(OpKey.parse("aten::_fft_c2r"), ("complex64",),
                      load_knowledge(release="2.8.0", macos="14.0")).verdict is Verdict.NATIVE
    # an op no complex-supported OpInfo runs in complex stays unsupported
    assert predict_op(OpKey.parse("aten::topk"), ("complex64",), kb).evidence.rule == "dtype-complex"


# --- 2. an expectation holds only under the condition its comment states ---------------------------


def test_bincount_expectation_applies_to_its_weighted_form_only():
    """common_mps.py: "bincount": [int8..int64, uint8]  # returned output on CPU is float64 -- the OpInfo's
    weighted samples (integer weights: float64 counts on the CPU). Unweighted and float32-weighted counting
    runs on MPS."""
    plain = scan(_options("bag_counts"))
    assert _rows(plain) == set() and plain.lane.name == "mac-first"
    assert _rows(scan(_options("bag_counts_weighted"))) == set()
    weighted = scan(_options("bag_counts_int_weights"))
    row = next(r for r in weighted.rows if r.op.name == "bincount")
    assert (row.dtypes, row.verdict, row.evidence.rule) == (("int64", "int64"), Verdict.UNSUPPORTED_DTYPE, "dtype-xfail")
    assert "'returned output on CPU is float64'" in row.evidence.text
    assert "expectation_conditions.yaml" in row.evidence.source


def test_every_condition_quotes_its_entry_comment_in_each_release():
    from opscan.knowledge import load_knowledge
    from opscan.knowledge.entry import load_store
    from opscan.knowledge.expectations import load_conditions
    from opscan.opkey import Release

    releases = [line.release for line in load_store().index]
    conditions = load_conditions()
    assert conditions
    for condition in conditions:
        covered = [r for r in releases if condition.releases.covers(r)]
        assert covered, condition
        for release in covered:
            lists = load_knowledge(release=release).common_mps
            assert lists.note(condition.list, condition.opinfo) == condition.comment, (release, condition.opinfo)
        before = [r for r in releases if Release.parse(r) < condition.releases.first]
        assert all(load_knowledge(release=r).common_mps is None or
                   load_knowledge(release=r).common_mps.note(condition.list, condition.opinfo) != condition.comment
                   for r in before)


# --- 4. sparse layouts: seen in the trace, judged from the release's SparseMPS registrations ---------


def _sparse_rows(report):
    return {(r.op.display, r.verdict, r.evidence.rule) for r in report.rows if r.evidence.rule.startswith("sparse-")}


def test_a_graph_convolution_on_a_sparse_adjacency_is_judged_by_sparse_mps_kernels():
    report = scan(_options("gnn"))  # 2.14.1: SparseMPS kernels for addmm (sparse @ dense) and mm
    assert _sparse_rows(report) == {
        ("aten::addmm", Verdict.NATIVE, "sparse-mps-kernel"),  # torch.sparse.mm's forward (CPU: _sparse_addmm)
        ("aten::mm", Verdict.NATIVE, "sparse-mps-kernel"),  # its backward: adjacency.t() @ grad
        # no SparseMPS kernel of its own: its composite body's sparse branch (transpose: clone, _indices,
        # _coalesced_, all SparseMPS in 2.14.1; composite_paths.yaml sparse_paths) decides
        ("aten::t", Verdict.NATIVE, "sparse-composite-path"),
    }
    t = next(r for r in report.rows if r.op.display == "aten::t" and r.evidence.rule == "sparse-composite-path")
    assert "transpose.int (native)" in t.evidence.text and "TensorShape.cpp" in t.evidence.source
    assert not [r for r in report.rows if r.verdict is Verdict.UNKNOWN]
    addmm = next(r for r in report.rows if r.op.display == "aten::addmm")
    assert "SparseMPS" in addmm.evidence.text and addmm.cpu_op.display == "aten::_sparse_addmm"


@pytest.mark.parametrize("release", ["2.8.0", "2.4.0"])
def test_sparse_tensors_are_unsupported_where_the_release_has_no_sparse_mps_backend(release):
    """pytorch#129842, #141320: no SparseMPS dispatch key in native_functions.yaml before 2.9.0."""
    report = scan(_options("gnn", torch_version=release))
    sparse = _sparse_rows(report)
    assert sparse == {(op, Verdict.UNSUPPORTED, "sparse-no-mps-backend") for op in ("aten::addmm", "aten::mm", "aten::t")}
    row = next(r for r in report.rows if r.op.display == "aten::addmm")
    assert "registers no SparseMPS kernel" in row.evidence.text and "2.9.0" in row.remedy
    dense = [r for r in report.rows if not r.evidence.rule.startswith("sparse-")]
    assert all(r.verdict is not Verdict.UNSUPPORTED or r.op.name == "lerp_" for r in dense)


def test_a_sparse_op_without_a_listed_branch_stays_not_modelled():
    from opscan.knowledge import load_knowledge
    from opscan.opkey import OpKey
    from opscan.predict.sparse import predict_sparse

    kb = load_knowledge(release="2.14.1")
    found = predict_sparse(OpKey.from_yaml("narrow"), ("sparse_coo",), kb)  # composite, no sparse branch listed
    assert found.verdict is Verdict.UNKNOWN and found.evidence.text.startswith("sparse layout: not modelled")
    assert predict_sparse(OpKey.from_yaml("t"), ("sparse_csr",), kb).evidence.rule == "sparse-not-modelled"


def test_the_trace_records_sparse_layouts():
    from opscan.scan import prepare
    from opscan.trace.records import TensorMeta

    assert TensorMeta("float32", (2,), (1,), "cpu", 1, 8).to_dict().get("layout") is None  # dense JSON unchanged
    prepared = prepare(_options("gnn"))
    sparse = {c.op.display for c in prepared.trace.calls if any(t.layout == "sparse_coo" for t in c.inputs)}
    assert "aten::_sparse_addmm" in sparse
    meta = next(t for c in prepared.trace.calls for t in c.inputs if t.sparse)
    assert meta.to_dict()["layout"] == "sparse_coo" and meta.shape == (6, 6)
    assert {c.op.display for c in prepared.view if any(t.sparse for t in c.inputs)} >= {"aten::addmm", "aten::mm"}


def test_a_probe_never_measures_a_sparse_call_with_dense_tensors():
    from opscan.probe.calls import from_call
    from opscan.scan import prepare

    prepared = prepare(_options("gnn"))
    sparse = next(c for c in prepared.trace.calls if c.op.name == "_sparse_addmm")
    assert from_call(sparse) == ("aten::_sparse_addmm: sparse layout: not modelled (a sparse_coo input; probes "
                                 "build dense tensors)")


# --- 5. a composite decided when no callee can be native ----------------------------------------------


@pytest.mark.parametrize("release", ["2.0.0", "2.4.0"])
def test_embedding_bag_backward_is_decided_in_releases_where_it_is_a_composite(release):
    """2.0.0-2.4.1: _embedding_bag_backward is CompositeImplicitAutograd (2.14.1 runs its own kernel, so the trace
    has no callees). Its body branches on `sparse`: the dense path calls _embedding_bag_dense_backward (no MPS
    kernel there), the sparse path returns a sparse COO gradient (no SparseMPS there)."""
    report = scan(_options("embedding_bag", torch_version=release))
    row = next(r for r in report.rows if r.op.name == "_embedding_bag_backward")
    assert (row.verdict, row.evidence.rule) == (Verdict.UNSUPPORTED, "composite-path")
    assert "takes the path `not sparse`" in row.evidence.text and "composite_paths.yaml" in row.evidence.source
    assert report.summary["unknown"] == {"ops": 0, "calls": 0}


def test_without_arguments_every_path_bounds_the_verdict():
    from opscan.knowledge import load_knowledge
    from opscan.opkey import OpKey
    from opscan.predict.rules import predict_op

    found = predict_op(OpKey.parse("aten::_embedding_bag_backward"), ("float32",), load_knowledge(release="2.0.0"))
    assert (found.verdict, found.evidence.rule) == (Verdict.UNSUPPORTED, "composite-no-native-path")
    assert "at least unsupported" in found.evidence.text
    # outside the entry's releases nothing changes: 2.5.0 gives it a CPU kernel and no MPS one
    later = predict_op(OpKey.parse("aten::_embedding_bag_backward"), ("float32",), load_knowledge(release="2.5.0"))
    assert later.evidence.rule == "no-mps-kernel"


def test_the_least_severe_path_decides_and_a_possibly_native_path_decides_nothing(monkeypatch):
    from opscan.knowledge import load_knowledge
    from opscan.knowledge.composite_paths import CompositePaths, Path
    from opscan.knowledge import callees
    from opscan.opkey import OpKey, ReleaseRange
    from opscan.predict.rules import predict_op

    kb = load_knowledge(release="2.0.0")
    op = OpKey.parse("aten::_embedding_bag_backward")

    def crafted(*calls):
        entry = CompositePaths(op.yaml_name, ReleaseRange.parse("2.0.0"), tuple(Path(c) for c in calls), "crafted")
        monkeypatch.setattr(callees, "paths_for", lambda name, release: entry if name == op.yaml_name else None)
        return predict_op(op, ("float32",), kb)

    # one path ends in an always-CPU op (cpu_fallback), the other in an op with no MPS kernel (unsupported)
    mixed = crafted(("embedding_renorm_",), ("_embedding_bag_dense_backward",))
    assert (mixed.verdict, mixed.evidence.rule) == (Verdict.CPU_FALLBACK, "composite-no-native-path")
    # a path whose callees are all native could be the one taken: nothing is decided
    open_path = crafted(("add.Tensor",), ("_embedding_bag_dense_backward",))
    assert (open_path.verdict, open_path.evidence.rule) == (Verdict.UNKNOWN, "composite-no-callees")


# --- the audit of common_mps.py's lists (docs/common-mps-audit.md) ------------------------------------


def test_the_audit_doc_matches_the_installed_releases_lists():
    """The doc is generated from the wheels (tools/audit_common_mps.py --wheels DIR --check); what can be checked
    without them: its 2.14.1 rows equal the tool's counts on the installed torch's common_mps.py, and it covers
    every release from 2.8.0 in the knowledge base."""
    import re
    import sys
    from collections import Counter

    from opscan.knowledge.common_mps import installed_path
    from opscan.knowledge.entry import load_store
    from opscan.knowledge.opinfo import load_opinfo_map

    from conftest import REPO

    sys.path.insert(0, str(REPO / "tools"))
    import audit_common_mps as audit

    if not torch.__version__.startswith("2.14.1"):
        pytest.skip("the doc's 2.14.1 rows are checked against torch 2.14.1's own common_mps.py")
    doc = (REPO / "docs" / "common-mps-audit.md").read_text(encoding="utf-8")
    with open(installed_path(), encoding="utf-8") as fh:
        entries = audit.list_entries(fh.read())
    omap, spelled = load_opinfo_map(), {c for n in audit._yaml_names() for c in audit.opinfo_candidates(n)}
    counts = Counter()
    for name, key, dtypes, _ in entries:
        counts[(name, audit.reach(key, name, dtypes, omap, spelled) is None)] += 1
    for name in {n for n, _ in counts}:
        row = re.search(rf"^\| 2\.14\.1 \| `{name}` \| [^|]+ \| (\d+) \| \d+ \| (\d+) \| (\d+) \|$", doc, re.M)
        assert row, name
        assert tuple(map(int, row.groups())) == (counts[(name, True)] + counts[(name, False)], counts[(name, True)],
                                                 counts[(name, False)]), name
    from opscan.opkey import Release

    releases = [line.release for line in load_store().index if Release.parse(line.release).numbers >= (2, 8)]
    assert len(releases) == 10 and all(f"| {r} | `SUPPORTED_COMPLEX_OPS` |" in doc for r in releases)
    # the FFT OpInfos of SUPPORTED_COMPLEX_OPS now reach _fft_c2c / _fft_c2r
    assert not re.search(r"`SUPPORTED_COMPLEX_OPS` \| `fft\.", doc)
