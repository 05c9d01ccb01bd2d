"""The build tools of issue 15's knowledge: what can be checked without the wheels (tools/)."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

from build_kernel_checks import mps_kernels  # noqa: E402
from macho_checks import _message, function_name  # noqa: E402

YAML = """- func: add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)
  structured: True
  dispatch:
    CPU, CUDA: add_out
    MPS: add_out_mps
- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
  structured_delegate: add.out
- func: _lstm_mps(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)
  dispatch:
    MPS: _lstm_mps
- func: mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
  dispatch:
    CPU: mul_out
"""


def test_mps_kernel_names_map_to_their_overloads_and_delegates():
    kernels = mps_kernels(YAML)
    assert kernels["add_out_mps"] == {"add.out", "add.Tensor"}  # add.Tensor runs its delegate's kernel
    assert kernels["_lstm_mps"] == {"_lstm_mps"}
    assert "mul_out" not in kernels  # no MPS key


def test_function_names_from_mangled_symbols():
    assert function_name("__ZN2at6native9_lstm_mpsERKNS_6TensorEN3c108ArrayRefIS1_EES6_bxdbbb") == "_lstm_mps"
    assert function_name("__ZN2at6native24structured_addmm_out_mps4implERKNS") == "addmm_out_mps"
    assert function_name("__ZN2at6nativeL21_mps_convolution_implERKNS_6Tensor") == "_mps_convolution_impl"
    assert function_name("__ZN3c106detail14torchCheckFailEPKcS2_jS2_") is None  # outside at::native


def test_message_fragments_drop_paths_function_names_and_asserts():
    strings = ["_lstm_mps", "/Users/runner/work/pytorch/pytorch/c10/core/TensorImpl.h",
               "x INTERNAL ASSERT FAILED at foo", "scatter(): Indexing dim ", " is out of bounds of tensor"]
    assert _message(strings) == ("scatter(): Indexing dim ", " is out of bounds of tensor")
