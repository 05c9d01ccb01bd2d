"""Report stage: the Report assembled from what a scan's stages made — its rows, its trace and MPS-view summaries,
the assumptions and environment it rests on, the graph, transfers and lane, the device-code findings
(opscan/scan.py runs the stages and calls `build_report`, which only assembles: `Stages` holds their results).

Measured on MPS (or a test double of it), the step graph, its transfers and the lane are built from the
measured verdicts of the MPS view's calls, never from the predicted ones; measured on cpu or cuda they stay
predicted for MPS. Every section of the report says which (`source`, as every row does). torch is imported
only inside `environment()`.
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from opscan import __version__
from opscan.opkey import Release, macos_text
from opscan.report import Report, RowUse, count_phases, disagreements, make_row, measured_rows
from opscan.report.where import places
from opscan.verdict import Classification, Source


@dataclass(frozen=True)
class Stages:
    """What a scan's stages made, for the report to assemble (opscan/scan.py runs them)."""

    predicted: list  # the predict stage's verdict of each MPS-view call
    rows: tuple  # the report's rows (report_rows)
    upgrade: Any  # predict/history.py Upgrade
    memory: dict[str, Any] | None  # the memory stage's section
    measurement: Any  # probe/stage.py Measurement, or None (predicted)
    graph: dict[str, Any]  # graph/stage.py graph_stage: lane, step graph, graph and transfer sections
    devices: tuple = ()  # predict/device_code.py DeviceFindings


def report_rows(prepared, predicted: list, since: dict, measurement) -> tuple:
    """The report's rows: the MPS view's calls grouped by (op, dtypes), each with its worst predicted verdict and
    its `since`, and with its measurement when the probes ran."""
    from opscan.predict.history import with_since

    kb, target, trace, view = prepared.kb, prepared.target, prepared.trace, prepared.view
    rows = tuple(make_row(use, with_since(found, since.get((use.op, use.dtypes)), kb.release))
                 for use, found in collect_rows(view, predicted, trace.calls, target.project, trace.hosts))
    if measurement is None:
        return rows
    return measured_rows(rows, measurement.rows, measurement.stands_for_mps, _platform(measurement))


def stands_for_mps(predicted: list, measurement) -> tuple[list, Source]:
    """(one verdict per MPS-view call, its source): the measured ones when the measurement stands for MPS."""
    if measurement is not None and measurement.stands_for_mps:
        return list(measurement.call_verdicts), Source.MEASURED
    return [v.verdict for v in predicted], Source.PREDICTED


def build_report(prepared, model: str, stages: Stages) -> Report:
    """The Report of `model` (the TARGET as given), assembled from what the scan's stages made (`stages`) and
    `prepared` (scan.Prepared: the knowledge base, target, trace and view)."""
    from opscan.predict.calls import decided_by
    from opscan.report.device_code import device_section, with_device_reasons

    kb, target, trace, view = prepared.kb, prepared.target, prepared.trace, prepared.view
    measurement, rows, project = stages.measurement, stages.rows, getattr(target, "project", None)
    summary = trace_summary(trace)
    summary.update(mps_view_calls=len(view), decided_by=dict(Counter(decided_by(v) for v in stages.predicted)),
                   mps_view=view_summary(trace, view), fake=target.fake is not None)
    summary["notes"][:0] = [target.fake.reason] if target.fake is not None else []
    graph = {**stages.graph, "lane": with_device_reasons(stages.graph["lane"], stages.devices, project)}
    return Report(
        opscan_version=__version__, kb_version=kb.kb_version, model=model, model_name=target.name,
        mode=_mode(measurement), assumptions=_assumptions(trace.torch_version, kb, measurement, prepared.notes),
        environment=environment(), phases=count_phases(trace.calls), rows=rows, trace=summary,
        modules=trace.modules, upgrade={**stages.upgrade.to_dict(), "source": Source.PREDICTED.value},
        memory={**stages.memory, "source": Source.PREDICTED.value} if stages.memory else None,
        measurement=None if measurement is None else {**measurement.section, "disagreements": disagreements(rows)},
        device_code=device_section(stages.devices, project), **graph,
    )


def _platform(measurement) -> str | None:
    """"macOS 15.2, Apple M2 Pro" from the probes' environment record (None off a Mac)."""
    env = (measurement.section.get("environment") or {}).get("off") or {}
    parts = [f"macOS {env['macos']}" if env.get("macos") else None, env.get("chip")]
    return ", ".join(p for p in parts if p) or None


def _mode(measurement) -> str:
    if measurement is None or not measurement.stands_for_mps:
        return "predicted"
    return "simulated" if measurement.where.simulated else "measured"


def collect_rows(view, verdicts, trace_calls=(), project: str | None = None,
                 hosts=()) -> list[tuple[RowUse, Classification]]:
    """Group MPS-view calls by (OpKey, input dtypes) in first-seen order; the worst verdict wins. `trace_calls`
    (the CPU trace's) give each row its `where`, with file names relative to `project` (report/where.py); `hosts`
    (the trace's HostSources) the causes of its placement findings (report/placement.py)."""
    from opscan.report.placement import with_placement
    from opscan.report.silent import with_silent

    groups: dict[tuple, list] = {}
    for call, found in zip(view, verdicts):
        groups.setdefault((call.op, call.dtypes), []).append((call, found))
    out = []
    for (op, dtypes), group in groups.items():
        worst = max((f for _, f in group), key=lambda f: f.verdict.rank)
        use, found = with_silent(_use(op, dtypes, [c for c, _ in group], trace_calls, project), worst, group)
        out.append(with_placement(use, found, group, hosts, trace_calls, project))
    return out


def _use(op, dtypes, calls, trace_calls=(), project: str | None = None) -> RowUse:
    shapes = tuple(dict.fromkeys(c.inputs[0].shape for c in calls if c.inputs and -1 not in c.inputs[0].shape))
    return RowUse(
        op=op, dtypes=dtypes, cpu_op=next((c.cpu_op for c in calls if c.cpu_op), None),
        phases=tuple(dict.fromkeys(c.phase for c in calls)),
        modules=tuple(dict.fromkeys(c.module for c in calls)), calls=len(calls), shapes=shapes[:3],
        where=places(calls, trace_calls, project),
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


def _assumptions(torch_version: str, kb, measurement=None, notes=()) -> dict[str, Any]:
    measured_on = {} if measurement is None else {"measured_on": measurement.where.label}
    return {
        "torch_release": kb.release,
        "installed_torch": torch_version,
        "macos": macos_text(kb.macos),
        "macos_source": kb.macos_source,
        "kb_entry": kb.origin if kb.entry is None else f"{kb.origin}: releases/{kb.entry}",
        "notes": list(kb.notes) + _what_if(torch_version, kb) + list(notes),
        "chip": kb.chip or "any Apple Silicon (M1 or newer)",
        "fallback_env": "unset",
        **measured_on,
    }


def _what_if(torch_version: str, kb) -> list[str]:
    if kb.release == Release.drop_local(torch_version):
        return []
    return [f"what-if: the step was traced with the installed torch {torch_version} and judged against torch "
            f"{kb.release}'s knowledge; decompositions and the MPS view can differ between releases"]


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
