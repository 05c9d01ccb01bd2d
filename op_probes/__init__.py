"""op_probes: curated probe-input builders for ops whose inputs must be valid, keyed by OpKey.

A probe replays a recorded call with seeded random floats. Integer inputs keep their recorded
values when the trace had them; when it did not (fake tensors, more values than the cap, capped
shapes), or when random floats are not valid input (a Cholesky factorisation needs a
positive-definite matrix), the builder registered for the op makes valid ones. One module per op
family: `indexing` (embedding, gather, scatter, index, index_put), `losses` (nll, ctc targets),
`linalg` (positive-definite and well-conditioned matrices), `pooling` (max-pool backward indices),
`elementwise` (positive inputs for sqrt/log/rsqrt, so their comparison means something).

The registry fails fast: a duplicate key or an overload that this torch does not have raises at
import. A builder is `fn(ctx)` with ctx an `opscan.probe.replay.BuildContext`.
"""

from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, Callable] = {}


class RegistryError(ValueError):
    """A builder registered twice, or for an overload this torch does not have."""


def register(*ops: str):
    """Decorator: register a builder for each op (display spelling, "aten::gather")."""
    def add(fn: Callable) -> Callable:
        for op in ops:
            _check_overload(op)
            if op in _REGISTRY:
                raise RegistryError(f"{op} already has a probe builder ({_REGISTRY[op].__module__}."
                                    f"{_REGISTRY[op].__name__}); one builder per overload")
            _REGISTRY[op] = fn
        return fn
    return add


def _check_overload(op: str) -> None:
    import torch

    from opscan.opkey import OpKey

    key = OpKey.parse(op)
    packet = getattr(getattr(torch.ops, key.namespace), key.name, None)
    if packet is None or key.overload not in packet.overloads():
        raise RegistryError(f"{op}: no such operator overload in torch {torch.__version__}")


def builder_for(op: str) -> Callable | None:
    """The builder registered for an op (display spelling), or None."""
    return _REGISTRY.get(op)


def builders() -> dict[str, Callable]:
    """A copy of the registered builders (OpKey display name -> builder)."""
    return dict(_REGISTRY)


from op_probes import elementwise, indexing, linalg, losses, pooling  # noqa: E402,F401  (fill the registry)
