"""Pipeline: compose target -> trace -> mps_view -> predict -> report. Nothing else lives here."""

from __future__ import annotations

import platform
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opscan import __version__
from opscan.report import Report, RowUse, count_phases, decide_lane, make_row
from opscan.verdict import Classification


@dataclass(frozen=True)
class ScanOptions:
    """What to scan and how (mirrors the CLI flags)."""

    target: str
    inputs: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    inference: bool = False
    dtype: str | None = None
    fx: bool = True
    yaml_path: str | None = None  # a native_functions.yaml other than the installed wheel's


def scan(options: ScanOptions) -> Report:
    """Run the whole predicted scan of one target and return its Report."""
    from opscan.inputs import parse_input
    from opscan.knowledge import load_knowledge
    from opscan.mps_view import mps_view
    from opscan.predict import classify_call, decided_by
    from opscan.target import load_target

    kb = load_knowledge(yaml_path=options.yaml_path)
    target = load_target(options.target, options.args, [parse_input(t) for t in options.inputs])
    trace = run_trace(target, options, kb)
    view = mps_view(trace)
    cache: dict = {}
    verdicts = [classify_call(call, kb, cache) for call in view]
    rows = tuple(make_row(use, found) for use, found in collect_rows(view, verdicts))
    summary = trace_summary(trace)
    summary["mps_view_calls"] = len(view)
    summary["decided_by"] = dict(Counter(decided_by(v) for v in verdicts))
    summary["mps_view"] = view_summary(trace, view)
    return Report(
        opscan_version=__version__, kb_version=kb.kb_version, model=options.target, model_name=target.name,
        mode="predicted", assumptions=_assumptions(trace.torch_version, kb), environment=environment(),
        phases=count_phases(trace.calls), rows=rows, lane=decide_lane(rows), trace=summary,
        modules=trace.modules,
    )


def run_trace(target, options: ScanOptions, kb):
    """Trace the step as MPS would dispatch it, turning the user's own failures into StepError."""
    from opscan.predict import has_mps_kernel, should_expand
    from opscan.trace import TraceOptions, trace_step
    from opscan.trace.guard import user_step

    trace_options = TraceOptions(options.inference, options.dtype, options.fx, macos=_macos(kb))
    with user_step(target.spec):
        return trace_step(target, trace_options, has_mps_kernel=has_mps_kernel(kb), expand=should_expand(kb))


def collect_rows(view, verdicts) -> list[tuple[RowUse, Classification]]:
    """Group MPS-view calls by (OpKey, input dtypes) in first-seen order; the worst verdict wins."""
    groups: dict[tuple, list] = {}
    for call, found in zip(view, verdicts):
        groups.setdefault((call.op, call.dtypes), []).append((call, found))
    return [(_use(op, dtypes, [c for c, _ in group]), max((f for _, f in group), key=lambda f: f.verdict.rank))
            for (op, dtypes), group in groups.items()]


def _use(op, dtypes, calls) -> RowUse:
    shapes = tuple(dict.fromkeys(c.inputs[0].shape for c in calls if c.inputs))
    return RowUse(
        op=op, dtypes=dtypes, cpu_op=next((c.cpu_op for c in calls if c.cpu_op), None),
        phases=tuple(dict.fromkeys(c.phase for c in calls)),
        modules=tuple(dict.fromkeys(c.module for c in calls)), calls=len(calls), shapes=shapes[:3],
    )


def trace_summary(trace) -> dict[str, Any]:
    """Counts and fx status for the report's `trace` section."""
    work = [c for c in trace.calls if not c.bookkeeping and c.parent is None]
    return {
        "calls": len(work),
        "bookkeeping_calls": sum(1 for c in trace.calls if c.bookkeeping),
        "callee_calls": sum(1 for c in trace.calls if c.parent is not None),
        "step": trace.mode,
        "device": trace.device,
        "module_attributed_calls": sum(1 for c in work if c.module_source != "none"),
        "fx": {"traced": trace.fx.traced, "reason": trace.fx.reason, "nodes": trace.fx.nodes},
        "notes": list(trace.notes),
    }


def view_summary(trace, view) -> list[dict[str, Any]]:
    """How the MPS view differs from the CPU trace: one entry per rewrite rule and mode."""
    counts = Counter((c.rule, "replace") for c in view if c.rule)
    counts.update((g.rule, "steer") for g in trace.groups if g.mode == "steer")
    from opscan.mps_view import VIEW_RULES

    sources = {**VIEW_RULES, **{g.rule: (g.condition, g.source) for g in trace.groups}}
    return [{"rule": rule, "mode": mode, "calls": n, "condition": sources[rule][0], "source": sources[rule][1]}
            for (rule, mode), n in counts.items()]


def _macos(kb) -> tuple[int, int]:
    major, _, minor = kb.facts.min_macos.partition(".")
    return int(major), int(minor or 0)


def _assumptions(torch_version: str, kb) -> dict[str, Any]:
    return {
        "torch_release": kb.release,
        "installed_torch": torch_version,
        "macos": kb.facts.min_macos,
        "macos_source": kb.facts.min_macos_source,
        "chip": "any Apple Silicon (M1 or newer)",
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
