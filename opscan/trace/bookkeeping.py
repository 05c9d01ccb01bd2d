"""Trace stage: calls that are not device work.

They stay in the trace and are counted, but never become report rows:
- `profiler::*` — `Optimizer.step` and `record_function` blocks enter and leave profiler ranges;
- `prim::*` — bookkeeping ops that fake-tensor and meta tracing can surface;
- `torchvision::_cuda_version` — the version query torchvision/extension.py's `_check_cuda_version()` makes when
  torchvision is first imported (inside a step when a forward imports it lazily): no tensor in, an int out, a
  plain `m.def` in torchvision/csrc/vision.cpp, so no device kernel runs.
"""

from __future__ import annotations

from opscan.opkey import OpKey

BOOKKEEPING_NAMESPACES = frozenset({"profiler", "prim"})
BOOKKEEPING_OPS = frozenset({OpKey.parse("torchvision::_cuda_version")})


def is_bookkeeping(op: OpKey) -> bool:
    """True for calls kept in the trace but never turned into findings."""
    return op.namespace in BOOKKEEPING_NAMESPACES or op in BOOKKEEPING_OPS
