"""op_probes: curated probe-input builders for ops whose inputs must be valid.

Keyed by OpKey (one module per op family: indices, masks, targets, positive-definite matrices, ...).
The registry is filled by the measured-mode issue; today it is empty and `builders()` says so.
"""

from __future__ import annotations

_REGISTRY: dict[str, object] = {}


def builders() -> dict[str, object]:
    """A copy of the registered builders (OpKey display name -> builder)."""
    return dict(_REGISTRY)
