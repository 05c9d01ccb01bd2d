"""Shared: marks the trace stage leaves in a trace for later stages to read (no torch here).

`opscan.move:<what>` — a profiler range around an explicit host move in user code (`.cpu()`,
`.to("cpu")`, `.tolist()`, printing), written by opscan.trace.moves and read by the graph stage.
"""

from __future__ import annotations

from opscan.opkey import OpKey

MOVE_PREFIX = "opscan.move:"
_ENTER = OpKey("profiler", "_record_function_enter_new")


def move_labels(calls) -> dict[int, str]:
    """CPU-trace call index -> the explicit move it belongs to ("cpu()", "tolist()", "print", ...)."""
    stack: list[str | None] = []
    out: dict[int, str] = {}
    for call in calls:
        if call.op.namespace == "profiler":
            if call.op == _ENTER:
                name = call.attrs[0] if call.attrs and isinstance(call.attrs[0], str) else ""
                stack.append(name[len(MOVE_PREFIX):] if name.startswith(MOVE_PREFIX) else None)
            elif call.op.name.startswith("_record_function_exit") and stack:
                stack.pop()
            continue
        label = next((s for s in reversed(stack) if s is not None), None)
        if label is not None:
            out[call.index] = label
    return out
