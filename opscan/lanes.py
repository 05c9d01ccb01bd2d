"""Lane rules computed from the transfer accounting (the verdict rules stay in report.decide_lane).

linux-gpu-first when the CPU fallback would move more bytes per step (both directions) than the step's
parameters and activations together (contract, "Lanes"): the reasons name the total, the footprint and
the rows whose calls move the most.
"""

from __future__ import annotations

from collections import defaultdict

from opscan.report import Row, signature_text
from opscan.transfers import Transfers, human_bytes


def transfer_reasons(t: Transfers, rows: tuple[Row, ...], top: int = 5) -> tuple[str, ...]:
    """The reasons for linux-gpu-first from transfers, or () when the rule does not apply."""
    if not t.fallback_exceeds_footprint:
        return ()
    moved = t.total("fallback")
    footprint = t.parameters_bytes + t.activations_bytes
    head = (f"the CPU fallback moves {human_bytes(moved.bytes)} per step ({moved.syncs} syncs), more than the "
            f"step's parameters and activations together ({human_bytes(footprint)})")
    per_row: dict[int, list] = defaultdict(lambda: [0, 0])
    for n in t.nodes:
        if n.kind == "fallback":
            per_row[n.row][0] += n.cost.bytes
            per_row[n.row][1] += 1
    ranked = sorted(per_row.items(), key=lambda kv: -kv[1][0])[:top]
    return (head, *(f"{rows[i].op.display} [{signature_text(rows[i].dtypes)}] is {rows[i].verdict.value}: "
                    f"moves {human_bytes(b)} per step in {calls} calls" for i, (b, calls) in ranked))
