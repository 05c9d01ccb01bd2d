"""Trace stage: calls that are not device work.

They stay in the trace and are counted, but never become report rows:
- `profiler::*` — `Optimizer.step` and `record_function` blocks enter and leave profiler ranges;
- `prim::*` — bookkeeping ops that fake-tensor and meta tracing can surface.
"""

from __future__ import annotations

from opscan.opkey import OpKey

BOOKKEEPING_NAMESPACES = frozenset({"profiler", "prim"})


def is_bookkeeping(op: OpKey) -> bool:
    """True for calls kept in the trace but never turned into findings."""
    return op.namespace in BOOKKEEPING_NAMESPACES
