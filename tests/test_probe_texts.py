"""The probe-text recognisers (opscan/probe/texts.py) on PyTorch's *real* texts, not on a test double's.

Each text below is copied verbatim — from PyTorch's source (the string literals of the macro call, joined as
c10's str() joins them, with the operator name and build hash the runtime puts in) or from a message users
pasted from a real run — and cites where it comes from. The test doubles (tests/simulated_mps,
tests/test_accept_placement.py) build their texts the same way; if PyTorch's text or a recogniser changes, this
file is where it shows. Facts about which release says what: /work/shared/mps_facts.md §1.4 (MPSFallback.mm's
messages, both generations) and §4.2 (dtype texts).
"""

from __future__ import annotations

import pytest

from opscan.accept.run import describe_failure
from opscan.probe.decide import decide
from opscan.probe.protocol import PassOutcome
from opscan.probe.texts import DISTRIBUTED, FALLBACK_WARNING, NOT_IMPLEMENTED, fallback_ops, is_dtype_error
from opscan.verdict import Verdict

# --- NotImplementedError of the boxed fallback with PYTORCH_ENABLE_MPS_FALLBACK unset (mps_error_fallback) ----
# torch 2.6 - 2.14.1: aten/src/ATen/mps/MPSFallback.mm, pytorch/pytorch@035290b77d8b4bd106cf5f9a728516d4335d5a42
# (2.6/2.7 era) and cyyever/pytorch@cf5e2e30c14c37fad4b9471dcb87d0dd8cb40167 (2.11+ era, same literals):
#   "The operator '", op.schema().operator_name(), "' is not currently implemented ",
#   "for the MPS device. If you want this op to be considered for addition ",
#   "please comment on https://github.com/pytorch/pytorch/issues/141287 and mention use-case, that resulted in
#   missing op", " as well as commit hash ", <COMMIT_SHA>, ". As a temporary fix, you can set the environment
#   variable `PYTORCH_ENABLE_MPS_FALLBACK=1` ", "to use the CPU as a fallback for this op. WARNING: this will be
#   slower than running natively ", "on MPS."
# with COMMIT_SHA of the 2.14.1 build (5c4886908584029761b579af026dcfb627c84070, torch/version.py git_version).
NEW_GENERATION = (
    "The operator 'aten::grid_sampler_3d' is not currently implemented for the MPS device. If you want this op to "
    "be considered for addition please comment on https://github.com/pytorch/pytorch/issues/141287 and mention "
    "use-case, that resulted in missing op as well as commit hash 5c4886908584029761b579af026dcfb627c84070. As a "
    "temporary fix, you can set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a "
    "fallback for this op. WARNING: this will be slower than running natively on MPS.")
# torch 2.0 - 2.5, pasted by a user from a real run (pytorch/pytorch#77764, comment of 2024-02-07 by
# gabrieldernbach); the literals are those of MPSFallback.mm at pytorch/pytorch@33ce58194cc44a42835a98ba3974bb99ca98fff3
OLD_GENERATION = (
    "The operator 'aten::_weight_norm_interface' is not currently implemented for the MPS device. If you want this "
    "op to be added in priority during the prototype phase of this feature, please comment on "
    "https://github.com/pytorch/pytorch/issues/77764. As a temporary fix, you can set the environment variable "
    "`PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. WARNING: this will be slower than "
    "running natively on MPS.")
# torch 1.12 / early 1.13 ("current implemented", sic), pasted from a real run (invoke-ai/InvokeAI#262)
TYPO_GENERATION = (
    "The operator 'aten::_index_put_impl_' is not current implemented for the MPS device. If you want this op to be "
    "added in priority during the prototype phase of this feature, please comment on "
    "https://github.com/pytorch/pytorch/issues/77764. As a temporary fix, you can set the environment variable "
    "`PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. WARNING: this will be slower than "
    "running natively on MPS.")
# torch 2.11+: mps_distributed_error, MPSFallback.mm at cyyever/pytorch@cf5e2e30c14c37fad4b9471dcb87d0dd8cb40167:
# a c10d op never falls back ("The distributed operator '", ..., ". Please note, that distributed operators can
# not fall back to CPU"); commit hash of the 2.14.1 build
DISTRIBUTED_TEXT = (
    "The distributed operator 'c10d::allreduce_' is not currently implemented for the MPS device. If you want this "
    "op to be considered for addition please comment on https://github.com/pytorch/pytorch/issues/141287 and "
    "mention use-case, that resulted in missing op as well as commit hash 5c4886908584029761b579af026dcfb627c84070. "
    "Please note, that distributed operators can not fall back to CPU")

# --- the UserWarning of mps_fallback (TORCH_WARN_ONCE, all releases), as Python shows it: c10's message, then
# " (Triggered internally at <file>:<line>.)" — each pasted from a real run:
FALLBACK_WARNINGS = {
    # pytorch/pytorch#106594 (torch 2.0.1, conda build)
    "aten::sgn.out": "The operator 'aten::sgn.out' is not currently supported on the MPS backend and will fall back "
                     "to run on the CPU. This may have performance implications. (Triggered internally at "
                     "/Users/runner/work/_temp/anaconda/conda-bld/pytorch_1690702789476/work/aten/src/ATen/mps/"
                     "MPSFallback.mm:13.)",
    # m87-labs/moondream#117 (2024, pip wheel)
    "aten::isin.Tensor_Tensor_out": "The operator 'aten::isin.Tensor_Tensor_out' is not currently supported on the "
                                    "MPS backend and will fall back to run on the CPU. This may have performance "
                                    "implications. (Triggered internally at /Users/runner/work/pytorch/pytorch/"
                                    "pytorch/aten/src/ATen/mps/MPSFallback.mm:13.)",
    # invoke-ai/InvokeAI#262 (torch 1.12, conda-forge build: two spaces after "at")
    "aten::nonzero": "The operator 'aten::nonzero' is not currently supported on the MPS backend and will fall back "
                     "to run on the CPU. This may have performance implications. (Triggered internally at  "
                     "/Users/runner/miniforge3/conda-bld/pytorch-recipe_1660136240338/work/aten/src/ATen/mps/"
                     "MPSFallback.mm:11.)",
}

# --- dtype texts (mps_facts §4.2): the literals of aten/src/ATen/mps/EmptyTensor.cpp and
# aten/src/ATen/native/mps/OperationUtils.mm (getMPSDataType: TORCH_CHECK_TYPE(false, "Trying to convert ",
# scalar_type, " to the MPS backend but it does not have support for that dtype.")), and users' pastes
DTYPE_TEXTS = [
    # EmptyTensor.cpp, all releases; pytorch/pytorch#122602
    "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. Please use float32 "
    "instead.",
    # OperationUtils.mm getMPSDataType, case ScalarType::Double
    "Cannot convert a float64 Tensor to MPS as the MPS framework doesn't support float64. Please use float32 instead.",
    # OperationUtils.mm getMPSDataType, default case; pytorch/pytorch#78044 (a CPU fallback's complex output)
    "Trying to convert ComplexFloat to the MPS backend but it does not have support for that dtype.",
    # the same, FP8 weights (Comfy-Org/ComfyUI#6995)
    "Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that dtype.",
    # torch <= 2.2 (QwenLM/Qwen#497, pytorch/pytorch#104191)
    "BFloat16 is not supported on MPS",
    # torch 2.3 - 2.8 on macOS 13, EmptyTensor.cpp (pytorch/torchchat#616)
    "MPS BFloat16 is only supported on MacOS 14 or newer",
    # torch 2.3 - 2.8 on macOS 13 [bin strings, mps_facts §4.2]
    "MPS complex types are only supported on MacOS 14.0 or newer.",
    # OperationUtils.h exec_binary_kernel
    "float64 is not supported on MPS",
    # aten/src/ATen/native/mps/operations/Convolution.mm: TORCH_CHECK(!is_unsupported_3d_dtype, "...")
    "ConvTranspose 3D with BF16 or FP16 types is not supported on MPS",
]
# texts that are *not* dtype errors, nor a missing kernel: MPS kernels' own limits (mps_facts §4.4)
KERNEL_LIMITS = [
    # aten/src/ATen/native/mps/operations/AdaptivePooling.mm: TORCH_CHECK((isizeH % osizeH == 0 && ...), "...")
    "Adaptive pool MPS: input sizes must be divisible by output sizes. Non-divisible input sizes are not implemented "
    "on MPS device yet. For now, you can manually transfer tensor to cpu in this case. Please refer to [this issue]"
    "(https://github.com/pytorch/pytorch/issues/96056)",
    # aten/src/ATen/mps/EmptyTensor.cpp: TORCH_CHECK(size.size() <= 16, "MPS supports tensors with dimensions <= 16,
    # but got ", size.size(), ".")
    "MPS supports tensors with dimensions <= 16, but got 17.",
    # RNN.cpp's TU in the 2.14.1 dylib [bin strings, mps_facts §4.4/§8]
    "LSTM with projections is not currently supported with MPS.",
]


def _missing_kernel(message: str) -> str | None:
    """decide.py's reading: a missing MPS kernel (not a c10d op, which never falls back) — the op it names."""
    found = NOT_IMPLEMENTED.search(message)
    return found.group("op") if found and not DISTRIBUTED.search(message) else None


@pytest.mark.parametrize("text, op", [(NEW_GENERATION, "aten::grid_sampler_3d"),
                                      (OLD_GENERATION, "aten::_weight_norm_interface"),
                                      (TYPO_GENERATION, "aten::_index_put_impl_")],
                         ids=["2.6-2.14.1", "2.0-2.5", "1.12-typo"])
def test_a_missing_kernel_is_recognised_in_every_generation_of_the_text(text, op):
    assert _missing_kernel(text) == op
    assert _missing_kernel("NotImplementedError: " + text) == op  # as the first line of a traceback's last line
    assert not is_dtype_error(text) and fallback_ops([text]) == []


def test_a_distributed_op_is_not_read_as_a_missing_kernel():
    assert DISTRIBUTED.search(DISTRIBUTED_TEXT).group("op") == "c10d::allreduce_"
    assert _missing_kernel(DISTRIBUTED_TEXT) is None  # no fallback can help: not "unsupported"


def test_the_accept_failure_line_names_the_op_from_the_real_text():
    line = describe_failure(NotImplementedError(NEW_GENERATION), "mps:0", ("backward", 1))
    assert line == ("the step fails on mps:0 in iteration 1, backward: aten::grid_sampler_3d is not implemented there "
                    "— NotImplementedError: The operator 'aten::grid_sampler_3d' is not currently implemented for "
                    "the MPS device.")


def test_the_fallback_warning_is_recognised_as_pytorch_prints_it():
    assert fallback_ops(["an unrelated warning", *FALLBACK_WARNINGS.values()]) == list(FALLBACK_WARNINGS)
    for op, text in FALLBACK_WARNINGS.items():
        assert FALLBACK_WARNING.search(text).group("op") == op
        assert _missing_kernel(text) is None and not is_dtype_error(text)


@pytest.mark.parametrize("text", DTYPE_TEXTS)
def test_pytorch_dtype_texts_are_dtype_errors(text):
    assert is_dtype_error(text)
    assert _missing_kernel(text) is None and fallback_ops([text]) == []


@pytest.mark.parametrize("text", KERNEL_LIMITS)
def test_mps_kernel_limits_are_neither_dtype_errors_nor_missing_kernels(text):
    assert not is_dtype_error(text) and _missing_kernel(text) is None and fallback_ops([text]) == []


def _raised(message: str, exc_type: str, pass_name: str = "off") -> PassOutcome:
    return PassOutcome("p", pass_name, "raised", exc_type=exc_type, message=message)


FELL_BACK = PassOutcome("p", "on", "ran", warnings=(FALLBACK_WARNINGS["aten::sgn.out"],), fallback_seen=True,
                        extra={"fallback_ops": fallback_ops([FALLBACK_WARNINGS["aten::sgn.out"]])})


@pytest.mark.parametrize("off, on, verdict", [
    *[(_raised(t, "NotImplementedError"), FELL_BACK, Verdict.UNSUPPORTED)
      for t in (NEW_GENERATION, OLD_GENERATION, TYPO_GENERATION)],
    (_raised(DISTRIBUTED_TEXT, "NotImplementedError"), _raised(DISTRIBUTED_TEXT, "NotImplementedError", "on"),
     Verdict.ERROR),
    *[(_raised(t, "TypeError"), None, Verdict.UNSUPPORTED_DTYPE) for t in DTYPE_TEXTS],
    *[(_raised(t, "RuntimeError"), None, Verdict.ERROR) for t in KERNEL_LIMITS],
    (PassOutcome("p", "off", "ran", warnings=tuple(FALLBACK_WARNINGS.values()), fallback_seen=True,
                 extra={"fallback_ops": fallback_ops(FALLBACK_WARNINGS.values())}), None, Verdict.CPU_FALLBACK),
])
def test_the_decision_table_reads_the_real_texts(off, on, verdict):
    decision = decide(off, on)
    assert decision.verdict == verdict, decision
    if verdict == Verdict.CPU_FALLBACK:
        assert all(op in decision.text for op in FALLBACK_WARNINGS), decision.text
