"""Trace stage: name the torch.fx node behind each forward call, where symbolic tracing works.

When `torch.fx.symbolic_trace` succeeds, the model's forward is run through an fx Interpreter over
the traced graph (same parameters, same submodules), which tells the recorder which node is running.
When it fails (most Hugging Face models), the reason is kept in one line and the eager forward runs.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.fx

from opscan.trace.guard import call_through
from opscan.trace.records import FxInfo


class _NodeNamer(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, recorder):
        super().__init__(gm, garbage_collect_values=True)
        self.recorder = recorder

    def run_node(self, n):
        previous, self.recorder.fx_node = self.recorder.fx_node, n.name
        try:
            return call_through(super().run_node, n)
        finally:
            self.recorder.fx_node = previous


def symbolic(model: torch.nn.Module) -> tuple[torch.fx.GraphModule | None, FxInfo]:
    """Try symbolic_trace; return the graph module or None, with what happened."""
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is just "no fx graph"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, FxInfo(False, f"{type(exc).__name__}: {first}"[:200])
    return gm, FxInfo(True, None, sum(1 for _ in gm.graph.nodes))


@contextlib.contextmanager
def forward_through(model: torch.nn.Module, gm: torch.fx.GraphModule | None, recorder):
    """While active, model(...) runs its traced graph and tags calls with fx node names."""
    if gm is None:
        yield
        return
    signature = inspect.signature(model.forward)

    def forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _NodeNamer(gm, recorder).run(*bound.arguments.values())

    model.forward = forward
    try:
        yield
    finally:
        del model.forward
