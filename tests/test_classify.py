"""Tests of the predict rules (opscan.predict.rules.predict) against the installed torch's knowledge."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opscan.predict.rules import predict_op
from opscan.knowledge import default_yaml_path, installed_release, load_knowledge
from opscan.predict.runtime_checks import note_from_shapes
from opscan.opkey import OpKey
from opscan.verdict import Verdict

K = OpKey.parse
F32 = ("float32",)
INSTALLED = installed_release()


@pytest.fixture(scope="module")
def kb():
    return load_knowledge()


def _without_mps(line: str) -> str | None:
    """A dispatch line minus the MPS key ("CPU, MPS: k" -> "CPU: k"; "MPS: k" -> None)."""
    keys, sep, kernel = line.strip().partition(":")
    names = [k.strip() for k in keys.split(",")]
    if not sep or "MPS" not in names:
        return line
    names.remove("MPS")
    return f"    {', '.join(names)}:{kernel}" if names else None


def drop_mps(yaml_text: str, func: str) -> str:
    """yaml_text with the `MPS` key removed from the dispatch of the entry `func` (e.g.
    "native_batch_norm(" for the default overload): the mutation the counts depend on."""
    head, sep, rest = yaml_text.partition(f"\n- func: {func}")
    assert sep, f"no entry {func!r}"
    entry, nxt, tail = rest.partition("\n- func:")
    lines = [_without_mps(line) if line.startswith("    ") else line for line in entry.split("\n")]
    assert lines != entry.split("\n"), f"{func!r} has no MPS dispatch key"
    kept = [line for line in lines if line is not None]
    return head + sep + "\n".join(kept) + nxt + tail


def mutated(kb, tmp_path, func: str, release: str | None = None):
    """Knowledge built from a copy of the yaml without MPS for `func`."""
    with open(default_yaml_path(), encoding="utf-8") as fh:
        text = fh.read()
    copy = tmp_path / "native_functions.yaml"
    copy.write_text(drop_mps(text, func), encoding="utf-8")
    return load_knowledge(yaml_path=str(copy), release=release)


def test_mutating_the_yaml_flips_native_batch_norm(kb, tmp_path):
    op = K("aten::native_batch_norm")
    assert predict_op(op, F32, kb).verdict is Verdict.NATIVE
    broken = mutated(kb, tmp_path, "native_batch_norm(")
    result = predict_op(op, F32, broken)
    assert result.verdict is Verdict.UNSUPPORTED and result.evidence.rule == "no-mps-kernel"
    assert broken.kb_version != kb.kb_version
    assert broken.yaml.mps_counts()[0] == kb.yaml.mps_counts()[0] - 1


@pytest.mark.parametrize("op, dtypes, verdict, rule", [
    ("aten::embedding_renorm_", ("float32", "int64"), Verdict.CPU_FALLBACK, "always-cpu"),
    ("aten::add.Tensor", ("float64", "float64"), Verdict.UNSUPPORTED_DTYPE, "dtype-float64"),
    ("aten::add.Tensor", ("complex128",), Verdict.UNSUPPORTED_DTYPE, "dtype-float64"),
    ("aten::add.Tensor", ("float32", "float32"), Verdict.NATIVE, "yaml-mps-delegate"),
    ("aten::add.out", ("float32", "float32"), Verdict.NATIVE, "yaml-mps"),
    ("aten::take", ("float32", "int64"), Verdict.UNSUPPORTED, "no-mps-kernel"),
    ("aten::put_", ("float32", "int64", "float32"), Verdict.UNSUPPORTED, "no-mps-kernel"),
    ("aten::linear", ("float32", "float32"), Verdict.NATIVE, "yaml-mps"),
    ("aten::_slow_conv2d_forward", ("float32", "float32"), Verdict.ERROR, "error-stub"),
    ("aten::adaptive_avg_pool2d", F32, Verdict.UNKNOWN, "composite-no-callees"),
    ("aten::definitely_not_an_op", F32, Verdict.UNKNOWN, "not-in-yaml"),
    ("mylib::custom_op", F32, Verdict.UNKNOWN, "namespace-no-table"),
    ("torchvision::not_in_table", F32, Verdict.UNKNOWN, "torchvision-not-in-table"),
    ("torchvision::nms", ("float32", "float32"), Verdict.NATIVE, "torchvision-mps"),
    ("torchvision::_roi_align_backward", F32, Verdict.NATIVE, "torchvision-mps"),
    ("c10d::allreduce_", F32, Verdict.ERROR, "c10d-no-fallback"),
])
def test_rules(kb, op, dtypes, verdict, rule):
    result = predict_op(K(op), dtypes, kb)
    assert (result.verdict, result.evidence.rule) == (verdict, rule)
    assert kb.release in result.evidence.text and result.evidence.source
    assert (result.remedy is None) == (verdict is Verdict.NATIVE)


def test_complex64_needs_the_supported_complex_list(kb):
    if kb.common_mps is None:
        result = predict_op(K("aten::add.Tensor"), ("complex64",), kb)
        assert result.evidence.rule == "dtype-complex-no-list"
        return
    assert predict_op(K("aten::add.Tensor"), ("complex64",), kb).verdict is Verdict.NATIVE
    assert predict_op(K("aten::add_.Tensor"), ("complex64",), kb).verdict is Verdict.NATIVE
    result = predict_op(K("aten::topk"), ("complex64",), kb)
    assert (result.verdict, result.evidence.rule) == (Verdict.UNSUPPORTED_DTYPE, "dtype-complex")
    assert "by name" in result.evidence.text and "SUPPORTED_COMPLEX_OPS" in result.evidence.source
    assert predict_op(K("aten::topk"), ("complex32",), kb).verdict is Verdict.UNSUPPORTED_DTYPE


def test_older_releases_use_their_own_facts(kb):
    svd = predict_op(K("aten::linalg_svd"), F32, load_knowledge(release="2.13.0"))
    assert svd.verdict is Verdict.CPU_FALLBACK and "upgrade to torch 2.14" in svd.remedy
    assert predict_op(K("c10d::allreduce_"), F32, load_knowledge(release="2.10.0")).verdict is Verdict.UNKNOWN
    old_nms = predict_op(K("torchvision::nms"), F32, load_knowledge(release="2.0.0"))
    assert (old_nms.verdict, old_nms.evidence.rule) == (Verdict.UNSUPPORTED, "torchvision-mps-later")
    old_deform = predict_op(K("torchvision::deform_conv2d"), F32, load_knowledge(release="2.7.0"))
    assert old_deform.verdict is Verdict.UNSUPPORTED


def test_python_registration_when_the_yaml_lacks_mps(kb, tmp_path):
    broken = mutated(kb, tmp_path, "native_group_norm(", release="2.12.0")
    result = predict_op(K("aten::native_group_norm"), F32, broken)
    assert (result.verdict, result.evidence.rule) == (Verdict.NATIVE, "python-registration")
    assert "2.12.0" in result.evidence.text


def test_composite_takes_its_worst_callee(kb):
    op = K("aten::adaptive_avg_pool2d")
    native = ((K("aten::_adaptive_avg_pool2d"), F32),)
    assert predict_op(op, F32, kb, callees=native).verdict is Verdict.NATIVE
    mixed = native + ((K("aten::take"), ("float32", "int64")),)
    result = predict_op(op, F32, kb, callees=mixed)
    assert (result.verdict, result.evidence.rule) == (Verdict.UNSUPPORTED, "composite-callees")
    assert "composite; callees:" in result.evidence.text and "aten::take (unsupported)" in result.evidence.text
    assert result.remedy and "PYTORCH_ENABLE_MPS_FALLBACK" in result.remedy
    nested = native + ((K("aten::expand"), F32),)  # itself a composite without callees
    assert predict_op(op, F32, kb, callees=nested).verdict is Verdict.UNKNOWN
    assert predict_op(op, F32, kb, callees=()).evidence.rule == "composite-no-callees"


def test_adaptive_pool_sizes_decide_error(kb):
    op = K("aten::_adaptive_avg_pool2d")
    bad = predict_op(op, F32, kb, args_note={"input_spatial": [7, 7], "output_size": [3, 3]})
    assert (bad.verdict, bad.evidence.rule) == (Verdict.ERROR, "shape-adaptive-avg-pool-divisible")
    assert "PYTORCH_ENABLE_MPS_FALLBACK does not help" in bad.remedy
    good = predict_op(op, F32, kb, args_note={"input_spatial": [6, 6], "output_size": [3, 3]})
    assert good.verdict is Verdict.NATIVE
    assert predict_op(op, F32, kb).verdict is Verdict.NATIVE  # no sizes: the kernel exists
    mixed = predict_op(op, F32, kb, args_note={"input_spatial": [7, 3], "output_size": [3, 6]})
    assert mixed.evidence.rule == "shape-adaptive-pool-direction"
    max_pool = predict_op(K("aten::adaptive_max_pool2d"), F32, kb,
                       args_note={"input_spatial": [7, 7], "output_size": [3, 3]})
    assert max_pool.verdict is Verdict.NATIVE  # max pooling skips the divisibility check


def test_adaptive_avg_pool_from_a_real_cpu_trace(kb):
    """What a dispatch-mode trace of nn.AdaptiveAvgPool2d((3, 3)) on 7x7 sees, classified."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            seen.append((OpKey.of(func), shapes, [tuple(out.shape)] if isinstance(out, torch.Tensor) else []))
            return out

    x = torch.randn(1, 2, 7, 7, requires_grad=True)
    with Recorder():
        torch.nn.AdaptiveAvgPool2d((3, 3))(x).sum().backward()
    pools = {op: predict_op(op, F32, kb, args_note=note_from_shapes(op, ins, outs))
             for op, ins, outs in seen if "adaptive" in op.name}
    assert set(pools) == {K("aten::_adaptive_avg_pool2d"), K("aten::_adaptive_avg_pool2d_backward")}
    assert {r.verdict for r in pools.values()} == {Verdict.ERROR}


def test_every_overload_gets_a_sourced_verdict_with_remedy(kb):
    for op in kb.yaml.overloads:
        result = predict_op(op, F32, kb)
        assert result.verdict in {Verdict.NATIVE, Verdict.UNKNOWN, Verdict.CPU_FALLBACK,
                                  Verdict.UNSUPPORTED, Verdict.ERROR}
        assert result.evidence.rule and result.evidence.source and kb.release in result.evidence.text
        assert (result.remedy is None) == (result.verdict is Verdict.NATIVE), op


@pytest.mark.skipif(INSTALLED != "2.14.1", reason=f"counts are for torch 2.14.1, installed {INSTALLED}")
def test_every_yaml_mps_kernel_predicts_native():
    # at macOS 15.0: below it, common_mps.py's MACOS_BEFORE_15_0_XFAILLIST gates linalg_matrix_exp
    kb = load_knowledge(macos="15.0")
    native = [op for op in kb.yaml.overloads if predict_op(op, F32, kb).evidence.rule.startswith("yaml-mps")]
    assert len(native) == 912
    gated = predict_op(K("aten::linalg_matrix_exp"), F32, load_knowledge(macos="14.0"))
    assert (gated.verdict, gated.evidence.rule) == (Verdict.UNKNOWN, "macos-gate")


def test_classify_never_imports_torch():
    code = ("import sys; from opscan.predict.rules import predict_op; from opscan.knowledge import load_knowledge; "
            "from opscan.opkey import OpKey; predict_op(OpKey.parse('aten::add.Tensor'), ('float32',), "
            "load_knowledge()); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- dtype expectations: common_mps.py through opinfo_map.txt ------------------------------------


def test_an_opinfo_expected_to_fail_marks_its_own_op_only():
    kb = load_knowledge(release="2.14.1")
    # common_mps.py 2.14.1: "nn.functional.linear": [int8, int16, int32, int64, uint8]; the map: name -> linear
    bad = predict_op(K("aten::linear"), ("int64", "int64"), kb)
    assert (bad.verdict, bad.evidence.rule) == (Verdict.UNSUPPORTED_DTYPE, "dtype-xfail")
    assert "'nn.functional.linear' (UNIMPLEMENTED_XFAILLIST)" in bad.evidence.text
    assert "common_mps.py (torch 2.14.1 wheel)" in bad.evidence.source and "opinfo_map.txt" in bad.evidence.source
    assert predict_op(K("aten::linear"), ("float32", "float32"), kb).verdict is Verdict.NATIVE
    # the CPU trace of F.linear shows addmm, but addmm's own OpInfo passes int64: no false positive
    assert predict_op(K("aten::addmm"), ("int64",) * 3, kb).verdict is Verdict.NATIVE
    # stft fails in float16; its samples dispatch reflection_pad1d, which is not stft's op (map: none)
    assert kb.opinfo.rows["stft"].method == "none"
    assert predict_op(K("aten::reflection_pad1d"), ("float16",), kb).verdict is Verdict.NATIVE


def test_every_mapped_opinfo_tested_in_the_dtype_must_expect_the_failure():
    # 2.8.0: round.decimals carries rounddecimals_0 (bfloat16 expected to fail) and rounddecimals_3 /
    # rounddecimals_neg_3 (bfloat16 expected to pass): no consensus, no verdict from the lists
    kb = load_knowledge(release="2.8.0", macos="14.0")
    assert {"rounddecimals_0", "rounddecimals_3"} <= set(kb.opinfo.by_overload["round.decimals"])
    assert predict_op(K("aten::round.decimals"), ("bfloat16",), kb).verdict is Verdict.NATIVE


def test_macos_gated_expectations_and_the_cpu_side_op():
    kb = load_knowledge(release="2.8.0")  # min macOS 13.0; isin's integer entries hold below macOS 14.0
    old = predict_op(K("aten::isin.Tensor_Tensor"), ("int64", "int64"), kb)
    assert old.evidence.rule == "dtype-xfail" and "below macOS 14.0" in old.evidence.text
    assert old.remedy.startswith("run macOS 14.0 or newer")
    newer = load_knowledge(release="2.8.0", macos="14.0")
    assert predict_op(K("aten::isin.Tensor_Tensor"), ("int64", "int64"), newer).verdict is Verdict.NATIVE
    # an op the map does not know is judged by the CPU trace's op it stands for
    via = predict_op(K("aten::_mps_convolution"), ("int64",), load_knowledge(release="2.14.1"), cpu_op=K("aten::linear"))
    assert via.evidence.rule == "dtype-xfail" and "(the CPU trace's aten::linear)" in via.evidence.text


def test_dtypes_a_release_lacks():
    bf16 = ("bfloat16", "bfloat16")
    old = predict_op(K("aten::add.Tensor"), bf16, load_knowledge(release="2.2.0"))
    assert (old.verdict, old.evidence.rule) == (Verdict.UNSUPPORTED_DTYPE, "dtype-release")
    assert predict_op(K("aten::add.Tensor"), bf16, load_knowledge(release="2.5.0")).evidence.rule == "dtype-release"
    assert predict_op(K("aten::add.Tensor"), bf16, load_knowledge(release="2.5.0", macos="14.0")).verdict is Verdict.NATIVE
    assert predict_op(K("aten::add.Tensor"), ("complex64",) * 2, load_knowledge(release="2.0.0")).verdict is \
        Verdict.UNSUPPORTED_DTYPE


def test_complex_support_through_the_opinfo_map():
    kb = load_knowledge(release="2.14.1")
    assert kb.common_mps.complex_match("normal", kb.macos) is None  # no OpInfo spells it...
    assert predict_op(K("aten::normal_"), ("complex64",), kb).verdict is Verdict.NATIVE  # ...'normalin_place' runs it
    assert predict_op(K("aten::topk"), ("complex64",), kb).evidence.rule == "dtype-complex"


def test_kernels_registered_outside_the_yaml():
    # mps_facts §2: 2.0.0's bitwise-ops .mm registers four overloads by hand
    result = predict_op(K("aten::bitwise_and.Tensor_out"), ("int64", "int64"), load_knowledge(release="2.0.0"))
    assert (result.verdict, result.evidence.rule) == (Verdict.NATIVE, "mps-outside-yaml")
    assert predict_op(K("aten::bitwise_and.Tensor_out"), ("int64",) * 2, load_knowledge(release="2.1.0")).verdict is \
        Verdict.NATIVE  # from 2.1.0 on the yaml has it
