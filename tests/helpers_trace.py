"""Small shared helpers for the trace tests: build a Target in-process and read a Trace back."""

from __future__ import annotations

import torch

from opscan.target.load import Target
from opscan.trace import Trace, TraceOptions, trace_step


def make_target(model: torch.nn.Module, inputs, *, train_step=None, loss_fn=None, build_optimizer=None) -> Target:
    """A Target built directly (no file import), named after the model class."""
    name = type(model).__name__
    return Target(f"<test>:{name}", name, model, inputs, train_step, loss_fn, build_optimizer)


def run_trace(model: torch.nn.Module, inputs, options: TraceOptions = TraceOptions(), **hooks) -> Trace:
    """trace_step over a freshly built Target."""
    return trace_step(make_target(model, inputs, **hooks), options)


def ops(trace: Trace, phase: str | None = None, module: str | None = None) -> list[str]:
    """Display names of the findable (non-bookkeeping) calls, in order, filtered by phase and module."""
    return [
        c.op.display
        for c in trace.findable()
        if (phase is None or c.phase == phase) and (module is None or c.module == module)
    ]


def calls_of(trace: Trace, op: str, phase: str | None = None) -> list:
    """Every call of the op with this display name (optionally in one phase)."""
    return [c for c in trace.calls if c.op.display == op and (phase is None or c.phase == phase)]


class Wrap(torch.nn.Module):
    """Holds one layer as `layer`, so its calls are attributed to the module path "layer".

    `first=True` returns only the first element of a tuple output (nn.LSTM's `output`)."""

    def __init__(self, layer: torch.nn.Module, first: bool = False):
        super().__init__()
        self.layer = layer
        self.first = first

    def forward(self, x):
        out = self.layer(x)
        return out[0] if self.first else out
