"""Trace stage: the immutable records a trace hands to later stages.

No torch import here: records hold plain Python values (dtype names, shape tuples, device strings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opscan.opkey import OpKey

PHASES = ("forward", "loss", "backward", "optimizer")


@dataclass(frozen=True)
class TensorMeta:
    """One tensor argument or result of a call."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    storage: int  # storage identity within this trace (same number = same storage)
    nbytes: int

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "device": self.device,
            "storage": self.storage,
            "nbytes": self.nbytes,
        }


@dataclass(frozen=True)
class OpCall:
    """One dispatched operator call, in order."""

    index: int
    op: OpKey
    phase: str
    module: str  # dotted module path ("" = the model itself / no module)
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    bookkeeping: bool = False
    fx_node: str | None = None
    module_source: str = "hooks"  # hooks | autograd | parameter | none

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Input dtype signature (the report's row key with the OpKey)."""
        return tuple(t.dtype for t in self.inputs)


@dataclass(frozen=True)
class FxInfo:
    """Whether torch.fx.symbolic_trace succeeded, and why not."""

    traced: bool
    reason: str | None = None
    nodes: int = 0


@dataclass(frozen=True)
class Trace:
    """Everything the trace stage saw of one training (or inference) step."""

    calls: tuple[OpCall, ...]
    model_class: str
    mode: str  # "train" | "inference"
    modules: tuple[tuple[str, str], ...]  # (path, class name) in model order
    fx: FxInfo
    torch_version: str
    device: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def findable(self) -> tuple[OpCall, ...]:
        """Calls that are device work (bookkeeping excluded)."""
        return tuple(c for c in self.calls if not c.bookkeeping)
