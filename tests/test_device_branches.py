"""Device branches: the audit (tools/audit_device_branches.py, docs/device_branches.md) and the rows that make
the trace take MPS's side of a branch found there (opscan/trace/branches.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opscan.knowledge import load_knowledge
from opscan.mps_view import mps_view
from opscan.scan import ScanOptions, run_trace
from opscan.target.load import Target
from opscan.trace import TraceOptions, trace_step

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "device_branches.md"


def _audit():
    spec = importlib.util.spec_from_file_location("audit_device_branches", ROOT / "tools" / "audit_device_branches.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the audit


def test_the_scanner_finds_each_kind_of_device_test():
    source = '''
def f(x, device):
    if x.device.type == "cuda":        # 3: a comparison naming cuda
        pass
    if x.is_mps or x.is_cpu:            # 5: attributes
        pass
    ok = _device_has_foreach_support(device)   # 7: a helper
    devices = ["cpu", "cuda", "xpu"]    # 8: a device list
    if device_type != "cpu":            # 9: a device_type comparison
        pass
    y = x + 1                           # 11: nothing
'''
    hits = {h.line: h for h in _audit().scan_source("torch", "torch/x.py", source)}
    assert sorted(hits) == [3, 5, 7, 8, 9]
    assert hits[3].devices == {"cuda"} and hits[5].devices == {"mps", "cpu"}
    assert hits[7].helpers == {"_device_has_foreach_support"} and hits[3].function == "f"


def test_automatic_reasons_only_where_cpu_and_mps_take_the_same_side():
    audit = _audit()
    hit = audit.scan_source("timm", "timm/x.py", 'if x.device.type in ("cuda", "xpu"):\n    pass\n')[0]
    assert audit.classify(hit, []).relevant is False  # neither cpu nor mps matches: same side
    hit = audit.scan_source("timm", "timm/x.py", 'if x.device.type in ("cpu", "mps"):\n    pass\n')[0]
    assert audit.classify(hit, []).relevant is False  # both match: same side
    hit = audit.scan_source("timm", "timm/x.py", 'if x.device.type == "cpu":\n    pass\n')[0]
    assert audit.classify(hit, []).relevant is None  # cpu only: a human must review it


def _doc_rows(library: str) -> dict[tuple[str, str, str], str]:
    """(file, function, first line) -> relevant cell, from the shipped table."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 6 and cells[0].startswith(f"{library}/"):
            rows[(cells[0], cells[1], cells[2].split(" · ")[0])] = cells[4]
    return rows


def test_every_device_test_of_the_installed_torch_is_in_the_table_and_reviewed():
    audit = _audit()
    reviews = audit.load_review()
    hits = audit.scan("torch", audit.installed_files("torch", audit.TORCH_PATHS))
    rows = _doc_rows("torch")
    release = torch.__version__.split("+")[0]
    assert release in DOC.read_text(encoding="utf-8")
    assert len(hits) > 150  # torch 2.14.1: 196 lines (the other 9 rows are 2.13.0's only)
    for hit in hits:
        assert (hit.file, hit.function, str(hit.line)) in rows, (hit.file, hit.line, hit.text)
        assert audit.classify(hit, reviews).relevant is not None, (hit.file, hit.line)
    relevant = {k for k, v in rows.items() if v == "**yes**"}
    assert ("torch/nn/utils/clip_grad.py", "_get_total_norm", "92") in relevant
    assert ("torch/nn/modules/transformer.py", "TransformerEncoderLayer.forward", "905") in relevant


@pytest.mark.slow
def _reviewed_version(library: str) -> str:
    """The version of `library` docs/device_branches.md was generated from ("transformers 5.24.0")."""
    found = re.search(rf"\b{library} (\d[\w.]*)", DOC.read_text(encoding="utf-8"))
    assert found, f"docs/device_branches.md names no {library} version"
    return found.group(1).rstrip(".")


def test_the_reviewed_versions_are_the_pinned_ones():
    # a fresh install takes what constraints/torch-2.14.1.txt pins: the review must be of those versions
    pins = dict(line.split("==") for line in (ROOT / "constraints" / "torch-2.14.1.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for library in ("transformers", "timm"):
        assert pins.get(library) == _reviewed_version(library), (library, pins.get(library))


def test_every_device_test_of_transformers_and_timm_is_reviewed():
    from importlib.metadata import version

    audit = _audit()
    reviews = audit.load_review()
    for library in ("transformers", "timm"):
        hits = audit.scan(library, audit.installed_files(library))
        rows = _doc_rows(library)
        why = (f"the review is of {library} {_reviewed_version(library)}, {version(library)} is installed: install "
               "with -c constraints/torch-2.14.1.txt, or rerun tools/audit_device_branches.py and review the new hits")
        assert len(rows) == len(hits), why
        for hit in hits:
            assert (hit.file, hit.function, str(hit.line)) in rows, (why, hit.file, hit.line)
            assert audit.classify(hit, reviews).relevant is not None, (why, hit.file, hit.line)


# ---------------------------------------------------------------- branches that change the trace


class _Clipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _clip_step(model, optimizer, inputs):
    model(inputs).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


def _optimizer_ops(lens_on: bool) -> list[str]:
    torch.manual_seed(0)
    target = Target("clip", "_Clipped", _Clipped(), torch.randn(4, 8), _clip_step, None, None)
    kb = load_knowledge()
    trace = trace_step(target, TraceOptions(), has_mps_kernel=(lambda op: kb.yaml.mps_kernel(op) is not None)
                       if lens_on else None)
    return [c.op.name for c in trace.findable() if c.phase == "optimizer"]


def test_clip_grad_takes_the_per_tensor_loop_of_mps():
    # torch 2.14.1 clip_grad.py:92/170: foreach when _has_foreach_support(..., device) — True for cpu (['cpu'] is
    # added to the kernels list), False for mps (not in cuda, xpu, mtia, privateuse1): the CPU trace norms the 4
    # gradients with one _foreach_norm and scales them with _foreach_mul_; MPS runs one vector norm per gradient
    plain, mps = _optimizer_ops(False), _optimizer_ops(True)
    assert "_foreach_norm" in plain and "_foreach_mul_" in plain
    assert not any(op.startswith("_foreach") for op in mps)
    assert mps.count("linalg_vector_norm") == 4 + 1  # one per gradient, and the norm of the 4 norms


def test_the_steered_branch_reaches_the_report_with_its_source():
    torch.manual_seed(0)
    target = Target("clip", "_Clipped", _Clipped(), torch.randn(4, 8), _clip_step, None, None)
    trace = run_trace(target, ScanOptions("clip"), load_knowledge())
    steered = {g.rule: g for g in trace.groups if g.mode == "steer"}
    assert "_foreach_utils.py" in steered["mps-no-foreach-clip"].source
    from opscan.report.assemble import view_summary

    rules = {row["rule"]: row for row in view_summary(trace, mps_view(trace))}
    assert rules["mps-no-foreach-clip"]["source"] == steered["mps-no-foreach-clip"].source


def test_functions_that_compute_in_float64_except_on_mps_run_in_float32():
    from transformers.models.rt_detr import modeling_rt_detr

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):  # RTDetrSinePositionEmbedding's helper: float64 except on mps (modeling_rt_detr.py:860)
            pos = modeling_rt_detr.build_2d_sinusoidal_position_embedding(2, 2, 16, dtype=x.dtype)
            return self.proj(x + pos)

    def dtypes(lens_on: bool) -> set[str]:
        target = Target("pos", "Positions", Positions(), torch.randn(4, 16), None, None, None)
        kb = load_knowledge()
        trace = trace_step(target, TraceOptions(), has_mps_kernel=(lambda op: kb.yaml.mps_kernel(op) is not None)
                           if lens_on else None)
        return {d for c in trace.calls for d in c.dtypes}

    assert "float64" in dtypes(False)
    assert "float64" not in dtypes(True)
    assert modeling_rt_detr.build_2d_sinusoidal_position_embedding.__module__ == modeling_rt_detr.__name__  # restored


def test_deterministic_interpolate_takes_the_decomposition_mps_runs():
    # functional.py:5267 (2.14.1): off the CPU, under deterministic algorithms, bilinear goes through
    # torch._decomp.decompositions._upsample_linear_vec (index-based, its backward index_put), not the kernel
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return F.interpolate(self.conv(x), scale_factor=2, mode="bilinear")

    def ops() -> set[str]:
        target = Target("up", "Up", Up(), torch.randn(1, 1, 4, 4), None, None, None)
        return {c.op.name for c in mps_view(run_trace(target, ScanOptions("up"), load_knowledge()))}

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        deterministic = ops()
    finally:
        torch.use_deterministic_algorithms(before)
    assert not {"upsample_bilinear2d", "upsample_bilinear2d_backward"} & deterministic
    assert "_index_put_impl_" in deterministic  # the decomposition's backward: index_put into the grad
    assert "upsample_bilinear2d" in ops()  # not deterministic: the kernel, on MPS too
