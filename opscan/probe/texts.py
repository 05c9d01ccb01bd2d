"""Probe stage: PyTorch's own texts that the decision table keys on, as compiled patterns (stdlib only).

Sources: mps_facts.md §1.4 (MPSFallback.mm messages, both generations: 2.0–2.5 and 2.6–2.14.1) and
§4.2/§4.4 (dtype texts of EmptyTensor.cpp and OperationUtils.mm, op-specific dtype checks); the CPU and
CUDA dispatch macros' "<kernel>" not implemented for '<Dtype>'.
"""

from __future__ import annotations

import re

from opscan.probe.comparison import FALLBACK_WARNING, fallback_ops  # noqa: F401 - the one copy of that text

# NotImplementedError with the variable unset: 2.6+ ("...considered for addition...") and 2.0-2.5
# ("...added in priority during the prototype phase..."); "current implemented" is the 1.12 typo
NOT_IMPLEMENTED = re.compile(
    r"The operator '(?P<op>[^']+)' is not (?:currently|current) implemented for the MPS device")

# 2.11+: c10d ops never fall back
DISTRIBUTED = re.compile(r"The distributed operator '(?P<op>[^']+)' is not currently implemented for the MPS device")

DTYPE_TEXTS = tuple(re.compile(p) for p in (
    r"Cannot convert a MPS Tensor to float64 dtype",  # EmptyTensor.cpp, all releases
    r"Cannot convert a float64 Tensor to MPS",  # OperationUtils.mm getMPSDataType
    r"to the MPS backend but it does not have support for that dtype",  # OperationUtils.mm
    r"float64 is not supported on MPS",  # OperationUtils.h exec_binary_kernel
    r"MPS complex types are only supported on MacOS 14\.0 or newer",
    r"Complex types are supported starting from MacOS 14\.0\+",
    r"BFloat16 is not supported on MPS",  # <= 2.2
    r"MPS BFloat16 is only supported on MacOS 14 or newer",  # 2.3-2.8
    r"does not support (?:the )?dtype",  # sdpa and other MPS kernels
    r"is not supported on MPS for dtype",  # unique
    r"with BF16 or FP16 types is not supported on MPS",  # ConvTranspose 3D
    r"MPS (?:only|currently) supports? float",  # cholesky_inverse, geqrf, lu_solve
    r"not implemented for non-floating types",  # *_mps special functions
    r"not implemented for '\w+'",  # AT_DISPATCH on CPU/CUDA/MPS: "cholesky_cpu" not implemented for 'Half'
    r"Low precision dtypes not supported",  # linalg on CPU
    r"Unsupported dtype \w+",  # fft on CPU
))


def is_dtype_error(message: str) -> bool:
    """True when an exception message is one of PyTorch's dtype-support texts."""
    return any(p.search(message) for p in DTYPE_TEXTS)

