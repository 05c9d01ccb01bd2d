"""Runtime checks inside MPS kernels: kernel_checks.txt (read from the wheels), kernel_rules.yaml, rule 4c.

- the two steps of issue 15: an LSTM with proj_size and a float16 ConvTranspose3d are flagged with the
  kernel's own message and file:line, and their lane is not mac-first;
- one encoded check per kind (dtype, rank, size, flag, macOS), each on both sides of its condition;
- a native row whose kernel has checks the prediction does not model says so;
- the data: every release's count, every rule matched to a check, the parsers and the condition language.
"""

from __future__ import annotations

import pytest

from opscan.knowledge import load_knowledge
from opscan.knowledge.kernel_checks import expand, kind_of, load_checks, parse_checks, ranges
from opscan.knowledge.conditions import TensorArg, compile_when
from opscan.knowledge.kernel_rules import load_kernel_rules, rules_encoding
from opscan.opkey import OpKey
from opscan.knowledge.signatures import load_signatures
from opscan.predict.rules import predict_op
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import TARGETS

LIMITS = f"{TARGETS / 'kernel_limits.py'}"
K = OpKey.parse


def _row(report, name: str):
    return next(r for r in report.rows if r.op.name == name)


def test_lstm_with_projections_is_an_error_with_the_kernels_message():
    report = scan(ScanOptions(f"{LIMITS}:lstm_proj", torch_version="2.14.1"))
    row = _row(report, "_lstm_mps")
    assert row.verdict == Verdict.ERROR and row.evidence.rule == "kernel-lstm-projections"
    assert "LSTM with projections is not currently supported with MPS." in row.evidence.text
    # __LINE__ as compiled into the 2.14.1 dylib (git 5c48869), read by tools/build_kernel_checks.py
    assert "aten/src/ATen/native/mps/operations/RnnOps.mm:102" in row.evidence.source
    assert report.lane.name != "mac-first"
    plain = scan(ScanOptions(f"{LIMITS}:lstm", torch_version="2.14.1"))
    assert _row(plain, "_lstm_mps").verdict == Verdict.NATIVE  # h0 and c0 both have 64 features


def test_conv_transpose3d_in_float16_is_an_unsupported_dtype_with_the_kernels_message():
    report = scan(ScanOptions(f"{LIMITS}:unet3d", dtype="float16", torch_version="2.14.1"))
    row = _row(report, "_mps_convolution_transpose")
    assert row.verdict == Verdict.UNSUPPORTED_DTYPE and row.evidence.rule == "kernel-conv-transpose-3d-half"
    assert "ConvTranspose 3D with BF16 or FP16 types is not supported on MPS" in row.evidence.text
    assert "Convolution.mm:1143" in row.evidence.source
    assert report.lane.name != "mac-first"
    fp32 = scan(ScanOptions(f"{LIMITS}:unet3d", torch_version="2.14.1"))
    assert _row(fp32, "_mps_convolution_transpose").verdict == Verdict.NATIVE


def _args(key, values: tuple, release: str = "2.14.1") -> dict:
    """Values in schema order bound to the op's argument names, as predict/bind.py binds a recorded call's."""
    return dict(zip((a.name for a in load_signatures().arguments(key.yaml_name, release)), values))


def _predict(op: str, values: tuple, macos: str | None = None, release: str = "2.14.1"):
    kb = load_knowledge(release=release, macos=macos)
    key = K(op)
    return predict_op(key, ("float32",), kb, args=_args(key, values))


def test_dtype_check_fires_on_five_dimensional_half_input_only():
    x5h = TensorArg("float16", (1, 4, 4, 4, 4))
    assert _predict("aten::_mps_convolution_transpose", (x5h,)).verdict == Verdict.UNSUPPORTED_DTYPE
    x4h = TensorArg("float16", (1, 4, 4, 4))  # ConvTranspose2d: rank 4, the check does not apply
    assert _predict("aten::_mps_convolution_transpose", (x4h,)).verdict == Verdict.NATIVE


def test_rank_check_dot_needs_two_vectors():
    found = _predict("aten::dot", (TensorArg("float32", (3, 4)), TensorArg("float32", (3, 4))))
    assert found.verdict == Verdict.ERROR and found.evidence.rule == "kernel-dot-1d"
    assert _predict("aten::dot", (TensorArg("float32", (4,)), TensorArg("float32", (4,)))).verdict == Verdict.NATIVE


def test_size_check_norm_refuses_more_than_2_pow_32_elements():
    big = TensorArg("float32", (65536, 65537))  # 65536 * 65537 = 4,295,032,832 > 2**32 = 4,294,967,296
    found = _predict("aten::linalg_vector_norm", (big,))
    assert found.verdict == Verdict.ERROR and "64-bit indexing" in found.evidence.text
    small = TensorArg("float32", (65536, 65536))  # exactly 2**32: canUse32BitIndexMath still holds
    assert _predict("aten::linalg_vector_norm", (small,)).verdict == Verdict.NATIVE
    unknown = TensorArg("float32", (-1, 65537))  # a size known only at run time: not decided
    assert _predict("aten::linalg_vector_norm", (unknown,)).verdict == Verdict.NATIVE


def test_macos_gate_fft_below_14_in_2_3_to_2_8():
    # FastFourierTransform.mm of 2.3.0-2.8.0: "FFT operations are only supported on MacOS 14+" (kernel_checks.txt
    # kc-ae59e3f9, kc-be7f2cf1, kc-306628b3 [bin]); 2.4.0's minimum macOS is 12.3 (facts.yaml). Issue 25's zoo:
    # fno1d/stft_mask/mel_cnn/autoformer at 2.4.0 were native there. Each op cites its own kernel's check.
    real, cplx = (TensorArg("float32", (2, 16)), (1,), 0, True), (TensorArg("complex64", (2, 9)), (1,), 0, 16)
    for op, values, function in (("aten::_fft_r2c", real, "_fft_r2c_mps_out"),
                                 ("aten::_fft_c2r", cplx, "_fft_c2r_mps_out"),
                                 ("aten::_fft_c2c", (TensorArg("complex64", (2, 16)), (1,), 0, True),
                                  "_fft_c2c_mps_out")):
        found = _predict(op, values, release="2.4.0")
        if op == "aten::_fft_r2c":  # complex input is refused earlier, by the dtype rule (complex below macOS 14)
            assert found.verdict == Verdict.ERROR and found.evidence.rule == "kernel-fft-macos-14", op
            assert "FFT operations are only supported on MacOS 14+" in found.evidence.text
            assert "FastFourierTransform.mm" in found.evidence.source and function in found.evidence.text
        kb = load_knowledge(release="2.4.0", macos="14.0")
        key = K(op)
        on_14 = predict_op(key, (values[0].dtype,), kb, args=_args(key, values))
        assert on_14.verdict != Verdict.ERROR and on_14.evidence.rule != "kernel-fft-macos-14", op
        assert _predict(op, values).verdict != Verdict.ERROR, op  # 2.14.1: the check is gone


def test_flag_check_svd_driver():
    a = TensorArg("float32", (64, 64, 64))  # a batch that fits 2.14's threadgroup staging (a 4x4 runs on the CPU)
    found = _predict("aten::_linalg_svd", (a, False, True, "gesvd"))
    assert found.verdict == Verdict.ERROR and found.evidence.rule == "kernel-svd-driver"
    assert _predict("aten::_linalg_svd", (a, False, True, None)).verdict == Verdict.NATIVE


def test_macos_gate_matrix_exp_below_15():
    a = (TensorArg("float32", (3, 3)),)
    found = _predict("aten::linalg_matrix_exp", a)  # 2.14.1's minimum macOS is 14.0 (facts.yaml)
    assert found.verdict == Verdict.ERROR and found.evidence.rule == "kernel-matrix-exp-macos-15"
    assert "LinearAlgebra.cpp" in found.evidence.source
    assert _predict("aten::linalg_matrix_exp", a, macos="15.0").verdict != Verdict.ERROR


def test_a_native_row_names_the_checks_the_prediction_does_not_model():
    kb = load_knowledge(release="2.14.1")
    found = predict_op(K("aten::_embedding_bag"), ("float32", "int64", "int64"), kb)
    assert found.verdict == Verdict.NATIVE
    assert "runtime checks the prediction does not model" in found.evidence.text
    assert "EmbeddingBag.mm" in found.evidence.text and "kernel_checks.txt" in found.evidence.source


def test_every_release_has_its_checks_and_every_rule_its_check():
    checks = load_checks()
    assert checks.releases[0] == "2.0.0" and checks.releases[-1] == "2.14.1" and len(checks.releases) == 27
    counts = {r: checks.count(r) for r in checks.releases}
    assert all(n > 250 for n in counts.values()), counts  # every release's MPS sources have hundreds
    assert counts["2.14.1"] > counts["2.0.0"]  # the backend grew
    rules = load_kernel_rules().rules
    for rule in rules:
        assert any(rule in rules_encoding(c, rules) for c in checks.checks), rule.id
    lstm = next(c for c in checks.checks if c.message.startswith("LSTM with projections"))
    assert "2.0.0" in lstm.releases and "2.14.1" in lstm.releases and lstm.ops == ("_lstm_mps",)
    assert len({c.id for c in checks.checks}) == len(checks.checks)


def test_kinds_are_read_from_the_message():
    assert kind_of("ConvTranspose 3D with BF16 or FP16 types is not supported on MPS") == "dtype+rank"
    assert kind_of("Tiling of batch matmul for larger than 2**32 entries only available from MacOS15 "
                   "onwards") == "rank+size+macos"
    assert kind_of("Output channels > 65536 not supported at the MPS device. ") == "size"
    assert kind_of("Tensor for argument input is on  …  but expected on mps") == "other"


def test_release_ranges_round_trip():
    order = ["2.0.0", "2.1.0", "2.2.0", "2.3.0", "2.4.0"]
    members = {"2.0.0", "2.1.0", "2.3.0"}
    assert ranges(members, order) == "2.0.0-2.1.0,2.3.0"
    assert expand("2.0.0-2.1.0,2.3.0", order) == members


def test_parse_refuses_a_malformed_line_and_the_language_refuses_calls():
    with pytest.raises(ValueError):
        parse_checks("release 2.0.0 abc\nkc-1\tTORCH_CHECK\n")
    with pytest.raises(ValueError):
        compile_when("__import__('os').system('true')")
    with pytest.raises(ValueError):
        compile_when("self.storage")


def test_dtype_expectations_reach_the_mps_views_convolution_per_rank():
    # opinfo_map.txt: nn.functional.conv_transpose2d -> _mps_convolution_transpose@4 (its samples' input rank);
    # common_mps.py (2.8+): UNIMPLEMENTED_XFAILLIST["nn.functional.conv_transpose2d"] = [bfloat16, int64]
    x4 = TensorArg("bfloat16", (1, 4, 8, 8))
    found = _predict_dtype("aten::_mps_convolution_transpose", "bfloat16", (x4,))
    assert found.verdict == Verdict.UNSUPPORTED_DTYPE and found.evidence.rule == "dtype-xfail"
    assert "nn.functional.conv_transpose2d" in found.evidence.text
    assert "nn.functional.conv_transpose3d" not in found.evidence.text  # rank 5 only
    assert _predict_dtype("aten::_mps_convolution_transpose", "float16",
                          (TensorArg("float16", (1, 4, 8, 8)),)).verdict == Verdict.NATIVE
    # rank 5 in float16: conv_transpose3d's expectation; the kernel's own check decides first (rule 4c)
    x5 = TensorArg("float16", (1, 4, 4, 4, 4))
    assert _predict_dtype("aten::_mps_convolution_transpose", "float16", (x5,)).evidence.rule == \
        "kernel-conv-transpose-3d-half"
    report = scan(ScanOptions(f"{LIMITS}:unet2d", dtype="bfloat16", torch_version="2.14.1"))
    row = _row(report, "_mps_convolution_transpose")
    assert row.verdict == Verdict.UNSUPPORTED_DTYPE and row.evidence.rule == "dtype-xfail"


def _predict_dtype(op: str, dtype: str, values: tuple):
    kb = load_knowledge(release="2.14.1")
    key = K(op)
    return predict_op(key, (dtype, dtype), kb, args=_args(key, values))


def test_message_patterns_encode_dtype_checks_the_message_states():
    # ActivationKernel/UnaryKernel: "Not implemented for long" (softplus; kernel_checks.txt, 2.14.1)
    found = _predict_dtype("aten::softplus", "int64", (TensorArg("int64", (4,)), 1, 20))
    assert found.verdict == Verdict.UNSUPPORTED_DTYPE and found.evidence.rule == "kernel-long-input"
    assert "Not implemented for long" in found.evidence.text
    assert _predict_dtype("aten::softplus", "float32", (TensorArg("float32", (4,)), 1, 20)).verdict == Verdict.NATIVE
    # "nextafter_mps not implemented for non-floating types"
    found = _predict_dtype("aten::nextafter", "int32", (TensorArg("int32", (4,)), TensorArg("int32", (4,))))
    assert found.evidence.rule == "kernel-non-floating"
    limits = load_knowledge(release="2.14.1").limits
    assert len(limits.encoded) >= 40  # six hand-written rules and the message patterns' checks


# ---------------------------------------------------------------- Conv3D (issue 38)

R3D = f"{TARGETS / 'kernel_limits.py'}:r3d_18"


def _conv3d_verdict(kb) -> Verdict:
    """The verdict of a Conv3d's `_mps_convolution` call (5-D input, as the MPS view records it) under `kb`."""
    key = K("aten::_mps_convolution")
    clip, weight = TensorArg("float32", (1, 3, 4, 32, 32)), TensorArg("float32", (64, 3, 3, 7, 7))
    return predict_op(key, ("float32", "float32"), kb,
                      args=_args(key, (clip, weight, None, [0, 3, 3], [1, 2, 2], [1, 1, 1], 1), kb.release)).verdict


def test_conv3d_on_2_1_makes_a_torchvision_video_model_linux_gpu_first():
    # Convolution.mm:77 of 2.0.0-2.2.2: TORCH_CHECK(input_t.dim() < 5, "Conv3D is not supported on MPS")
    report = scan(ScanOptions(R3D, torch_version="2.1.0", memory=False))
    row = _row(report, "_mps_convolution")
    assert row.verdict == Verdict.ERROR and row.evidence.rule == "kernel-conv3d"
    assert "Conv3D is not supported on MPS" in row.evidence.text and "Convolution.mm:77" in row.evidence.source
    assert report.lane.name == "linux-gpu-first"


@pytest.mark.parametrize(("macos", "verdict"), [("13.1", Verdict.ERROR), ("13.2", Verdict.NATIVE)])
def test_conv3d_on_2_3_needs_macos_13_2(macos, verdict):
    report = scan(ScanOptions(R3D, torch_version="2.3.0", macos=macos, memory=False))
    row = _row(report, "_mps_convolution")
    assert row.verdict == verdict
    if verdict == Verdict.ERROR:
        assert row.evidence.rule == "kernel-conv3d-macos-13-2" and "MacOS_13_2" in row.evidence.text
        assert report.lane.name == "linux-gpu-first"
    else:
        assert report.lane.name == "mac-first"  # every row of R3D-18's step is native on 2.3.0, macOS 13.2


def test_conv3d_check_is_per_rank_and_per_release():
    assert _conv3d_verdict(load_knowledge(release="2.0.0")) == Verdict.ERROR
    assert _conv3d_verdict(load_knowledge(release="2.8.0", macos="13.1")) == Verdict.ERROR
    assert _conv3d_verdict(load_knowledge(release="2.9.0")) == Verdict.NATIVE  # the check is gone (macOS 14+)
    key = K("aten::_mps_convolution")  # a Conv2d (4-D) on 2.1.0 is not touched by the check
    conv2d = _args(key, (TensorArg("float32", (1, 3, 32, 32)), TensorArg("float32", (8, 3, 3, 3)), None, [0, 0],
                         [1, 1], [1, 1], 1), "2.1.0")
    assert predict_op(key, ("float32", "float32"), load_knowledge(release="2.1.0"), args=conv2d).verdict == \
        Verdict.NATIVE


def test_mutation_removing_the_conv3d_condition_fails_its_test():
    """The Conv3D rules removed from the knowledge (kernel_rules.yaml without them): the call the tests above judge
    `error` is then native, so they would fail — the rule, not something else, decides it."""
    from dataclasses import replace
    from types import MappingProxyType

    kb = load_knowledge(release="2.1.0")
    assert _conv3d_verdict(kb) == Verdict.ERROR
    limits = kb.limits
    mutated = MappingProxyType({op: tuple((r, c) for r, c in pairs if not r.id.startswith("conv3d"))
                                for op, pairs in limits.rules_by_op.items()})
    assert mutated["_mps_convolution"] != limits.rules_by_op["_mps_convolution"]
    assert _conv3d_verdict(replace(kb, limits=replace(limits, rules_by_op=mutated))) == Verdict.NATIVE


# ---------------------------------------------------------------- issue 38: each encoded class on both sides

_F = TensorArg("float32", (4, 8))
_H = TensorArg("float16", (4, 8))
_L = TensorArg("int64", (4, 8))
_D6 = TensorArg("float32", (2, 2, 2, 2, 2, 8))
_BIG = TensorArg("float32", (65536, 65537))  # more than 2**32 elements
_HX = [TensorArg("float32", (2, 3, 64)), TensorArg("float32", (2, 3, 64))]


@pytest.mark.parametrize(("op", "fires", "holds", "release", "macos", "rule"), [
    ("aten::_lstm_mps", (None, _HX, [], True, 2), (None, _HX, [], True, 1), "2.0.0", None,
     "kernel-lstm-multilayer-macos-13"),
    ("aten::topk", (_D6, 3, 0), (_D6, 3, -1), "2.8.0", None, "kernel-topk-axis-depth"),
    ("aten::kthvalue", (_D6, 1, 0, False), (_D6, 1, 3, False), "2.9.0", None, "kernel-kthvalue-axis-depth"),
    ("aten::grid_sampler_2d", (_F, _F, 2, 0, False), (_F, _F, 0, 0, False), "2.1.0", None,
     "kernel-grid-sampler-2d-bicubic"),
    ("aten::grid_sampler_3d", (_F, _F, 1, 0, False), (_F, _F, 0, 0, False), "2.10.0", None,
     "kernel-grid-sampler-3d-nearest"),
    ("aten::_softmax", (_H, -1, True), (_H, -1, False), "2.14.1", None, "kernel-softmax-half-to-float"),
    ("aten::div.Tensor_mode", (_H, _H, "trunc"), (_H, _H, "floor"), "2.5.0", None, "kernel-trunc-divide-half"),
    ("aten::linalg_lu_factor_ex", (_F, False), (_F, True), "2.14.1", None, "kernel-lu-factor-no-pivot"),
    ("aten::bmm", (TensorArg("float32", (64, 8192, 64)), TensorArg("float32", (64, 64, 8193))),
     (TensorArg("float32", (64, 8192, 64)), TensorArg("float32", (64, 64, 8192))), "2.14.1", "14.0",
     "kernel-bmm-tiling-macos-15"),
    ("aten::masked_fill_.Scalar", (_BIG, _BIG, 0.0), (_F, _F, 0.0), "2.14.1", None, "kernel-masked-fill-2-32"),
    ("aten::argmax", (_BIG,), (_F,), "2.14.1", None, "kernel-argmax-64bit-indexing"),
    ("aten::dot", (TensorArg("int64", (8,)), TensorArg("int64", (8,))),
     (TensorArg("int64", (8,)), TensorArg("int64", (8,))), "2.7.0", None, "kernel-dot-int64-macos-13"),
    ("aten::_linalg_svd", (TensorArg("float16", (64, 64, 64)), False, True, None),
     (TensorArg("float32", (64, 64, 64)), False, True, None), "2.14.1", None, "kernel-svd-float32-complex64"),
    ("aten::cumsum", (_L, 0), (_F, 0), "2.8.0", "13.2", "kernel-int64-macos-13-3"),  # a message pattern
    ("aten::pow.Tensor_Tensor", (_L, _L), (_L, _L), "2.4.0", None, "kernel-pow-int64-macos-13-2"),
    ("aten::mm", (_L, _L), (_F, _F), "2.5.0", None, "kernel-float-only"),  # Blas/LinearAlgebra.mm 2.1.0-2.6.0
])
def test_each_encoded_check_class_on_both_sides_of_its_condition(op, fires, holds, release, macos, rule):
    dtypes = ("int64",) if fires[0] is not None and getattr(fires[0], "dtype", "") == "int64" else ("float32",)
    kb = load_knowledge(release=release, macos=macos)
    key = K(op)
    found = predict_op(key, dtypes, kb, args=_args(key, fires, release))
    assert found.evidence.rule == rule and found.verdict in (Verdict.ERROR, Verdict.UNSUPPORTED_DTYPE), found
    macos_after = {"kernel-dot-int64-macos-13": "14.0", "kernel-pow-int64-macos-13-2": "13.2"}.get(rule)
    other = predict_op(key, dtypes, load_knowledge(release=release, macos=macos_after) if macos_after else kb,
                       args=_args(key, holds, release))
    assert other.evidence.rule != rule


def test_fused_sgd_under_a_grad_scaler_is_an_error_on_mps():
    p = [TensorArg("float32", (8,))]
    key = K("aten::_fused_sgd_")
    kb = load_knowledge(release="2.7.0")  # FusedSgdKernel.mm of 2.5.0-2.7.1 (kc-e6a8479a)
    base = (p, p, p, 0.0, 0.9, 0.1, 0.0, False, False, False)
    scaled = predict_op(key, ("float32",), kb, args=_args(key, (*base, TensorArg("float32", ()), None), "2.7.0"))
    assert scaled.evidence.rule == "kernel-fused-sgd-grad-scale" and scaled.verdict == Verdict.ERROR
    plain = predict_op(key, ("float32",), kb, args=_args(key, (*base, None, None), "2.7.0"))
    assert plain.evidence.rule != "kernel-fused-sgd-grad-scale"


def test_a_check_of_a_shared_helper_holds_only_for_the_op_its_condition_names():
    """BinaryOps.mm's binaryOpTensor holds "MPS: <op> op with int64 input is supported natively starting from macOS
    13.2" for every binary op's kernel, but its condition is `op_name == "power" && ...`: an int64 `ne` on 2.4.0 at
    macOS 12.3 is native (a message pattern over every attached op made it unsupported_dtype; found by
    test_kernel_fallbacks' pyg GCN step)."""
    key, longs = K("aten::ne.Tensor"), TensorArg("int64", (4,))
    kb = load_knowledge(release="2.4.0")
    found = predict_op(key, ("int64", "int64"), kb, args=_args(key, (longs, longs), "2.4.0"))
    assert found.verdict == Verdict.NATIVE
