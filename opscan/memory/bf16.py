"""Memory stage: would the step run in bfloat16 on MPS? (classify each call with float32 cast away).

The bfloat16 saving (estimate.py halves every float32 storage) only holds when every op of the step
has a bfloat16 kernel on MPS in the predicted-for release (and macOS 14 or later: bfloat16 needs it).
Each distinct call of the MPS view is classified again with `float32` replaced by `bfloat16`; the
rows that come out worse than they are in float32 block the saving.
"""

from __future__ import annotations

from dataclasses import replace

from opscan.mps_view import MpsCall
from opscan.predict.calls import predict_call
from opscan.opkey import signature_text

BF16, F32 = "bfloat16", "float32"


def _cast(dtypes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(BF16 if d == F32 else d for d in dtypes)


def as_bf16(call: MpsCall) -> MpsCall:
    """The call with its float32 inputs (and its callees' ones) in bfloat16."""
    callees = None if call.callees is None else tuple((op, _cast(d)) for op, d in call.callees)
    return replace(call, dtypes=_cast(call.dtypes), callees=callees)


def blockers(view: tuple[MpsCall, ...], kb, limit: int = 10) -> tuple[str, ...]:
    """Rows that bfloat16 would make worse than float32 ("aten::op [bfloat16×2] is unsupported_dtype")."""
    cache: dict = {}
    seen: set = set()
    out: list[str] = []
    for call in view:
        key = (call.op, call.dtypes, call.callees, call.cpu_op, call.rule)
        if key in seen or F32 not in call.dtypes:
            continue
        seen.add(key)
        cast = as_bf16(call)
        before, after = predict_call(call, kb, cache), predict_call(cast, kb, cache)
        if after.verdict.rank > before.verdict.rank:
            out.append(f"{call.op.display} [{signature_text(cast.dtypes)}] is {after.verdict.value}")
            if len(out) >= limit:
                break
    return tuple(dict.fromkeys(out))
