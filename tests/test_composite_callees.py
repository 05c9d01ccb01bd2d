"""composite_callees.txt (issue 24 (b)): which aten ops each release's C++ composite kernels call, read from the
macOS wheels by tools/build_composite_callees.py — what can be checked without the wheels.

- known facts of the binaries (checked with llvm-objdump when the table was first built): `_safe_softmax` in
  2.5.x vs 2.6+, binary_cross_entropy_with_logits before and from 2.3.0, attention's math path before 2.5;
- live: for the installed torch's release, the table's callees contain what its composite kernels really dispatch
  (a handful run here through their composite kernel), and the mutation (a callee or a row removed) is caught;
- facts.yaml's hand-kept earlier_paths entries agree with the table (the binary backs each).
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode

from opscan.knowledge import installed_release, load_knowledge
from opscan.knowledge.composite_callees import CalleeTable, Kernel, format_table, load_callees, parse_table

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

from build_composite_callees import _wrapper_name, classify, yaml_ops  # noqa: E402
from macho_arm64 import nested_names  # noqa: E402

TABLE = load_callees()
KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.CompositeExplicitAutograd,
        DispatchKey.CompositeExplicitAutogradNonFunctional)


def _callees(op: str, release: str) -> frozenset[str] | None:
    kernel = TABLE.kernel(op, release)
    return None if kernel is None else kernel.callees


def test_the_table_covers_every_release_of_the_knowledge_base():
    from opscan.knowledge import kb_releases

    assert TABLE.releases == kb_releases()
    assert all(len(TABLE.kernels[r]) > 1700 for r in TABLE.releases)  # every composite, not only the drifted


def test_safe_softmax_called_eq_and_where_in_2_5_and_isneginf_from_2_6():
    old = {"all.dim", "eq.Tensor", "scalar_tensor", "softmax.int", "where.self"}
    assert _callees("_safe_softmax", "2.5.0") == _callees("_safe_softmax", "2.5.1") == old
    assert "isneginf" in _callees("_safe_softmax", "2.6.0") and "eq.Tensor" not in _callees("_safe_softmax", "2.6.0")
    assert _callees("_safe_softmax", "2.4.1") is None  # not a composite (not declared) before 2.5


def test_bce_with_logits_took_the_log_path_until_2_2_2_and_log_sigmoid_from_2_3_0():
    for release in ("2.0.0", "2.1.2", "2.2.2"):
        callees = _callees("binary_cross_entropy_with_logits", release)
        assert {"neg", "clamp_min_", "exp_", "log_"} <= callees and "log_sigmoid" not in callees, release
    for release in ("2.3.0", "2.14.1"):
        callees = _callees("binary_cross_entropy_with_logits", release)
        assert "log_sigmoid" in callees and not {"neg", "exp_"} & callees, release


def test_attention_math_path_had_no_safe_softmax_before_2_5():
    for release in ("2.0.0", "2.4.1"):
        callees = _callees("_scaled_dot_product_attention_math", release)
        assert "softmax.int" in callees and "_safe_softmax" not in callees
    assert "_safe_softmax" in _callees("_scaled_dot_product_attention_math", "2.5.0")


def test_one_hot_rms_norm_and_group_norm_as_the_binaries_say():
    assert "min" in _callees("one_hot", "2.12.1") and "aminmax" in _callees("one_hot", "2.13.0")
    assert "_fused_rms_norm" not in _callees("rms_norm", "2.7.1") and "_fused_rms_norm" in _callees("rms_norm", "2.8.0")
    assert "contiguous" in _callees("group_norm", "2.13.0") and "contiguous" not in _callees("group_norm", "2.14.0")


def test_the_table_round_trips_and_refuses_malformed_lines():
    releases = ["2.0.0", "2.1.0", "2.2.0"]
    per = {"2.0.0": {"a": Kernel("CIA", frozenset({"b", "c"})), "x": Kernel("CEA", None)},
           "2.1.0": {"a": Kernel("CIA", frozenset({"b", "c"})), "x": Kernel("CEA", frozenset())},
           "2.2.0": {"a": Kernel("CIA", frozenset({"d"}))}}
    text = format_table(releases, per, "# test\n")
    assert "a CIA 2.0.0..2.1.0 b c" in text and "a CIA 2.2.0 d" in text and "x CEA 2.0.0 ?" in text
    back = parse_table(text)
    assert {r: dict(t) for r, t in back.kernels.items()} == per
    assert back.drifted() == {"a", "x"}
    for bad in ("releases 2.0.0\na XYZ 2.0.0 b", "releases 2.0.0\na CIA 2.9.9 b", "a CIA 2.0.0 b"):
        with pytest.raises(ValueError):
            parse_table(bad)


def test_tool_names_ops_from_symbols_and_yaml():
    assert nested_names("_ZN2at4_ops11softmax_int4callERKNS_6TensorE") == ["at", "_ops", "softmax_int", "call"]
    assert classify("_ZN2at4_ops11softmax_int4callERKNS_6TensorE") == ("op", "softmax_int")
    assert classify("_ZN2at6native7softmaxERKNS_6TensorE")[0] == "follow"
    assert classify("_ZN3c1010TensorImplD2Ev")[0] == "stop"
    assert classify("OUTLINED_FUNCTION_12")[0] == "free"
    mangled = "_ZN2at12_GLOBAL__N_145wrapper_CompositeImplicitAutograd_int_softmaxERKNS_6TensorE"
    assert _wrapper_name(mangled) == "wrapper_CompositeImplicitAutograd_int_softmax"
    ops = yaml_ops("- func: softmax.int(Tensor self, int dim) -> Tensor\n"
                   "- func: relu(Tensor self) -> Tensor\n  dispatch:\n    CPU: relu\n"
                   "- func: f(Tensor self) -> Tensor\n  dispatch:\n    CompositeExplicitAutograd: f\n"
                   "  autogen: f.out\n")
    assert ops["softmax_int"].composite == "CompositeImplicitAutograd" and ops["relu"].composite is None
    assert ops["f_out"].composite == "CompositeExplicitAutograd" and ops["f_out"].name == "f.out"


class _Direct(TorchDispatchMode):
    """Records the ops dispatched directly beneath (inference_mode: nested CIA ops arrive whole)."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        overload = func._overloadname
        self.seen.add(func._opname if overload == "default" else f"{func._opname}.{overload}")
        return func(*args, **(kwargs or {}))


def _live() -> dict[str, set[str]]:
    """yaml name -> the ops the installed torch's composite kernel dispatched for these arguments."""
    a = torch.ops.aten
    x, y, img = torch.randn(4, 8), torch.rand(4, 8), torch.randn(2, 3, 8, 8)
    attn = torch.randn(2, 4, 5, 8)
    masked = torch.randn(3, 5).masked_fill(torch.tensor([True, False, True, False, True]), float("-inf"))
    cases = [(a._safe_softmax.default, (masked, -1)), (a.binary_cross_entropy_with_logits.default, (x, y)),
             (a.linear.default, (x, torch.randn(16, 8), torch.randn(16))),
             (a.matmul.default, (attn, attn.transpose(-1, -2))), (a.group_norm.default, (img, 1)),
             (a.cross_entropy_loss.default, (x, torch.tensor([1, 2, 3, 0]))),
             (a.one_hot.default, (torch.tensor([0, 3, 1]), 4)),
             (a.layer_norm.default, (x, [8], torch.ones(8), torch.zeros(8))),
             (a._scaled_dot_product_attention_math.default, (attn, attn, attn))]
    out = {}
    for op, args in cases:
        key = next(k for k in KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k))
        mode = _Direct()
        with torch.inference_mode(), mode:
            op._op_dk(key, *args)
        name = op._opname if op._overloadname == "default" else f"{op._opname}.{op._overloadname}"
        out[name] = mode.seen
    return out


def _missing(table: CalleeTable, live: dict[str, set[str]], release: str) -> dict[str, set[str]]:
    """op -> what its kernel dispatched live that the table's row for `release` lacks."""
    out = {}
    for op, seen in live.items():
        kernel = table.kernel(op, release)
        callees = kernel.callees if kernel is not None and kernel.callees is not None else frozenset()
        if seen - callees:
            out[op] = seen - callees
    return out


@pytest.fixture(scope="module")
def live():
    release = installed_release()
    if not TABLE.covers(release):
        pytest.skip(f"the table does not cover the installed torch {release}")
    return release, _live()


def test_live_composites_dispatch_only_what_the_table_lists_for_the_installed_release(live):
    release, seen = live
    assert all(seen.values())  # each case did run its kernel
    assert _missing(TABLE, seen, release) == {}


def test_mutation_a_callee_or_a_row_removed_is_caught(live):
    release, seen = live
    rows = {r: dict(t) for r, t in TABLE.kernels.items()}
    softmax = rows[release]["_safe_softmax"]
    rows[release]["_safe_softmax"] = Kernel(softmax.key, softmax.callees - {"softmax.int"})
    del rows[release]["one_hot"]
    mutant = CalleeTable(TABLE.releases, rows)
    assert set(_missing(mutant, seen, release)) == {"_safe_softmax", "one_hot"}


def test_hand_kept_earlier_paths_agree_with_the_binaries():
    # facts.yaml's `earlier_paths` entries that name a C++ composite (`within`): in each release of each series they
    # list, that kernel does not call the op, and calls something that runs `ran` (directly or one level down)
    facts = load_knowledge().all_facts
    checked = []
    for series in facts.series:
        for release in (r for r in TABLE.releases if r.rsplit(".", 1)[0] == series):
            for path in facts.for_release(release).earlier_paths.values():
                if path.within is None or not TABLE.kernel(path.within.yaml_name, release):
                    continue  # a Python-level path (another table's business)
                callees = _callees(path.within.yaml_name, release)
                assert callees is not None and path.op.yaml_name not in callees, (release, path)
                reach = set(callees) | {c for x in callees for c in (_callees(x, release) or ())}
                assert path.ran[0].yaml_name in reach, (release, path)
                checked.append((release, path.op.yaml_name))
    assert ("2.4.1", "_safe_softmax") in checked and ("2.0.0", "_safe_softmax") in checked
