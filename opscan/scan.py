"""Pipeline: compose target -> trace -> predict -> report. Nothing else lives here."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from opscan import __version__
from opscan.opkey import OpKey
from opscan.report import Report, RowUse, count_phases, decide_lane, make_row
from opscan.verdict import NOT_CLASSIFIED, Classification


@dataclass(frozen=True)
class ScanOptions:
    """What to scan and how (mirrors the CLI flags)."""

    target: str
    inputs: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    inference: bool = False
    dtype: str | None = None
    fx: bool = True


Classifier = Callable[[RowUse], Classification]


def scan(options: ScanOptions, classifier: Classifier | None = None, kb_version: str = "none") -> Report:
    """Run the whole predicted scan of one target and return its Report."""
    from opscan.inputs import parse_input
    from opscan.target import load_target
    from opscan.trace import TraceOptions, trace_step

    target = load_target(options.target, options.args, [parse_input(t) for t in options.inputs])
    trace = run_trace(target, TraceOptions(options.inference, options.dtype, options.fx))
    uses = collect_uses(trace.findable())
    classify = classifier or (lambda use: NOT_CLASSIFIED)
    rows = tuple(make_row(use, classify(use)) for use in uses)
    return Report(
        opscan_version=__version__,
        kb_version=kb_version,
        model=options.target,
        model_name=target.name,
        mode="predicted",
        assumptions=_assumptions(trace.torch_version),
        environment=environment(),
        phases=count_phases(trace.calls),
        rows=rows,
        lane=decide_lane(rows),
        trace=trace_summary(trace),
        modules=trace.modules,
    )


def run_trace(target, options):
    """Trace the step, turning failures of the user's own code into StepError."""
    from opscan.trace import trace_step
    from opscan.trace.guard import user_step

    with user_step(target.spec):
        return trace_step(target, options)


def collect_uses(calls) -> tuple[RowUse, ...]:
    """Group calls by (OpKey, input dtypes, CPU-side op) in first-seen order."""
    groups: dict[tuple, list] = {}
    for call in calls:
        cpu_op = getattr(call, "cpu_op", None)
        groups.setdefault((call.op, call.dtypes, cpu_op), []).append(call)
    return tuple(_use(op, dtypes, cpu_op, group) for (op, dtypes, cpu_op), group in groups.items())


def _use(op: OpKey, dtypes, cpu_op, group) -> RowUse:
    shapes = tuple(dict.fromkeys(tuple(t.shape for t in c.inputs[:1]) for c in group))
    return RowUse(
        op=op,
        dtypes=dtypes,
        cpu_op=cpu_op,
        phases=tuple(dict.fromkeys(c.phase for c in group)),
        modules=tuple(dict.fromkeys(c.module for c in group)),
        calls=len(group),
        shapes=tuple(s[0] for s in shapes if s)[:3],
    )


def trace_summary(trace) -> dict[str, Any]:
    """Counts and fx status for the report's `trace` section."""
    work = trace.findable()
    attributed = sum(1 for c in work if c.module_source != "none")
    return {
        "calls": len(work),
        "bookkeeping_calls": len(trace.calls) - len(work),
        "step": trace.mode,
        "device": trace.device,
        "module_attributed_calls": attributed,
        "fx": {"traced": trace.fx.traced, "reason": trace.fx.reason, "nodes": trace.fx.nodes},
        "notes": list(trace.notes),
    }


def _assumptions(torch_version: str) -> dict[str, Any]:
    return {
        "torch_release": torch_version.split("+")[0],
        "installed_torch": torch_version,
        "macos": None,
        "chip": None,
        "fallback_env": "unset",
    }


def environment() -> dict[str, Any]:
    """Where this scan ran."""
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": str(torch.__version__),
        "torch_git": getattr(torch.version, "git_version", None),
        "mps_built": bool(torch.backends.mps.is_built()),
        "mps_available": bool(torch.backends.mps.is_available()),
    }
