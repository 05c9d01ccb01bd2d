"""Pipeline: compose target -> trace -> mps_view -> predict -> [probe] -> graph -> report. Nothing else lives here.

Measured on MPS (or a test double of it), the step graph, its transfers and the lane are built from the
measured verdicts of the MPS view's calls, never from the predicted ones; measured on cpu or cuda they stay
predicted for MPS. Every section of the report says which (`source`, as every row does).
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opscan import __version__
from opscan.opkey import Release
from opscan.report import Report, RowUse, count_phases, disagreements, make_row, measured_rows
from opscan.verdict import Classification, Source


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
    fake: bool = False  # build and trace with fake tensors (trace/fake.py)
    auto_fake: bool = True  # ... or switch to them when a meta pre-pass says the step would not fit in RAM
    torch_version: str | None = None  # predict for this release (default: the installed one)
    macos: str | None = None  # assume this macOS (default: the release's minimum)
    probe: Any = None  # opscan.probe.stage.ProbeOptions: measure every distinct call (measured mode)
    memory: bool = True  # estimate the step's memory and size it for Macs (opscan/memory)
    live: Any = None  # opscan.memory.live.LiveOptions: --memory, a few real iterations on a device
    repro: bool = False  # add the `repro` section: what standalone repro scripts of the findings need

    def to_data(self) -> dict[str, Any]:
        """The options as JSON data (a bundle's manifest stores them): factory arguments as their reprs, read
        back with ast.literal_eval; `probe` and `live` are the run's, not the scan's, and are left out."""
        data = {name: getattr(self, name) for name in DATA_FIELDS}
        data["inputs"] = list(self.inputs)
        data["args"] = {key: _literal_repr(key, value) for key, value in self.args.items()}
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any], **overrides: Any) -> "ScanOptions":
        """The options `to_data` stored, with `overrides` (probe options, a moved target) applied."""
        import ast

        fields = {name: data[name] for name in DATA_FIELDS}
        fields["inputs"] = tuple(data["inputs"])
        fields["args"] = {key: ast.literal_eval(text) for key, text in data["args"].items()}
        return cls(**{**fields, **overrides})


DATA_FIELDS = ("target", "inference", "dtype", "fx", "yaml_path", "fake", "auto_fake", "torch_version", "macos",
               "memory", "repro")


def _literal_repr(key: str, value: Any) -> str:
    import ast

    from opscan.errors import UsageError

    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise UsageError(f"--arg {key}: {text} cannot be stored as a Python literal — pass a value "
                         "ast.literal_eval reads back (numbers, strings, tuples, lists, dicts)")
    return text


@dataclass(frozen=True)
class Prepared:
    """What every later stage starts from: the knowledge base, the loaded target, its trace and MPS view."""

    kb: Any
    target: Any
    trace: Any
    view: Any
    trackers: list  # the memory tracker (one), when options.memory
    # predict_call's caches, one per knowledge base (predict/history.py cache_of): scans of this trace for
    # several releases (opscan/zoo/releases.py) share them, so each release's judgement of a call is made once
    caches: dict = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)  # step graphs by the calls' verdicts, shared the same way


def prepare(options: ScanOptions) -> Prepared:
    """Load the knowledge base and the target, trace the step, and build its MPS view."""
    from opscan.target.inputs import parse_input
    from opscan.knowledge import load_knowledge
    from opscan.mps_view import mps_view
    from opscan.target.load import load_target

    kb = load_knowledge(yaml_path=options.yaml_path, release=options.torch_version, macos=options.macos)
    inputs = [parse_input(t) for t in options.inputs]
    target = load_target(options.target, options.args, inputs, _fake_choice(options))
    trackers: list = []
    trace = run_trace(target, options, kb, trackers if options.memory else None)
    return Prepared(kb, target, trace, mps_view(trace), trackers)


def scan(options: ScanOptions, session=None, prepared: Prepared | None = None) -> Report:
    """Run the whole scan of one target — predicted, and measured when `options.probe` — and return its Report
    (`prepared`: reuse a trace that prepare(options) already made, as `opscan bundle` does after planning its
    probes; `session` (probe.stage.Session) journals the probes in the report folder and draws the progress bar)."""
    from opscan.trace import collector

    prepared = prepared or prepare(options)
    with collector.spared():  # the trace, the model and the imports outlive every later stage (trace/collector.py)
        return _stages(options, session, prepared)


def _stages(options: ScanOptions, session, prepared: Prepared) -> Report:
    from opscan.predict.calls import predict_call
    from opscan.predict.history import cache_of

    kb, target, trace, view = prepared.kb, prepared.target, prepared.trace, prepared.view
    cache = cache_of(prepared.caches, kb)
    predicted = [predict_call(call, kb, cache) for call in view]
    memory = memory_stage(target, trace, view, kb, options, prepared.trackers)
    measurement = None
    if options.probe is not None:
        from opscan.probe.stage import measure

        measurement = measure(trace, view, options.probe, target.name, session)
    report = build_report(prepared, options, predicted, memory, measurement)
    command = repro_command(options)
    return report if command is None else with_repro(report, trace, view, command, measurement)


def build_report(prepared: Prepared, options: ScanOptions, predicted: list, memory, measurement) -> Report:
    """The Report: rows from the predictions (with their measurements), and the graph, transfers and lane from
    the verdicts that stand for MPS — the measured ones when the measurement does, else the predicted ones."""
    from opscan.predict.calls import decided_by
    from opscan.predict.history import since_and_upgrade, with_since

    kb, target, trace, view = prepared.kb, prepared.target, prepared.trace, prepared.view
    since, upgrade = since_and_upgrade(view, predicted, kb, prepared.caches)
    rows = tuple(make_row(use, with_since(found, since.get((use.op, use.dtypes)), kb.release))
                 for use, found in collect_rows(view, predicted))
    verdicts, source = [v.verdict for v in predicted], Source.PREDICTED
    if measurement is not None:
        rows = measured_rows(rows, measurement.rows, measurement.stands_for_mps)
        if measurement.stands_for_mps:
            verdicts, source = list(measurement.call_verdicts), Source.MEASURED
    summary = trace_summary(trace)
    summary.update(mps_view_calls=len(view), decided_by=dict(Counter(decided_by(v) for v in predicted)),
                   mps_view=view_summary(trace, view), fake=target.fake is not None)
    summary["notes"][:0] = [target.fake.reason] if target.fake is not None else []
    return Report(
        opscan_version=__version__, kb_version=kb.kb_version, model=options.target, model_name=target.name,
        mode=_mode(measurement), assumptions=_assumptions(trace.torch_version, kb, measurement),
        environment=environment(), phases=count_phases(trace.calls), rows=rows, trace=summary,
        modules=trace.modules, upgrade={**upgrade.to_dict(), "source": Source.PREDICTED.value},
        memory={**memory, "source": Source.PREDICTED.value} if memory else None,
        measurement=None if measurement is None else {**measurement.section, "disagreements": disagreements(rows)},
        **graph_stage(trace, view, verdicts, rows, memory, source, prepared.graphs),
    )


def _mode(measurement) -> str:
    if measurement is None or not measurement.stands_for_mps:
        return "predicted"
    return "simulated" if measurement.where.simulated else "measured"


def repro_command(options: ScanOptions) -> str | None:
    """The command line recorded in the `repro` section, or None when no section is wanted."""
    from opscan.repro.section import command_line

    return command_line(options) if options.repro else None


def with_repro(report: Report, trace, view, command: str, measurement=None) -> Report:
    """The report with its `repro` section (opscan/repro/section.py): from the measured plan and outcomes,
    or in predicted mode from a plan of the MPS view's calls at full shapes."""
    from dataclasses import replace

    from opscan.probe.calls import plan
    from opscan.repro.section import section

    if measurement is None:
        found = section(report.rows, plan(trace, view, "mps", None), command=command)
    else:
        found = section(report.rows, measurement.plan, measurement.result, measurement.section["device"], command)
    source = Source.PREDICTED if measurement is None else Source.MEASURED
    return replace(report, repro={**found, "source": source.value})


def memory_stage(target, trace, view, kb, options: ScanOptions, trackers: list) -> dict[str, Any] | None:
    """The report's `memory` section (opscan/memory): estimate, Mac sizing, and with `live` real iterations."""
    if not trackers:
        return None
    from opscan.memory.stage import estimate_memory
    from opscan.target.user_code import running

    with running(f"sizing the memory of {options.target}'s step at larger batches"):  # the step runs again
        section = estimate_memory(target, trace, view, kb, trackers[0], options.dtype, options.inference)
    if options.live is not None:
        from opscan.memory.live import live_section

        section["live"] = live_section(options.target, options.args, options.inputs, options.live)
    return section


def graph_stage(trace, view, verdicts, rows, memory: dict[str, Any] | None = None,
                source: Source = Source.PREDICTED, graphs: dict | None = None) -> dict[str, Any]:
    """The step graph, its transfers and the lane they help decide, all from `verdicts` (one per MPS-view call,
    predicted or measured as `source` says): the Report's keyword arguments. `graphs` keeps `trace`'s graphs
    (with their transfers) by verdicts: a scan of the same trace for another release with the same verdicts
    reuses one (a graph is a function of the trace, its view and the verdicts alone)."""
    from opscan.graph.build import build_graph
    from opscan.graph.views import graph_section
    from opscan.graph.lanes import decide_lane, transfer_reasons
    from opscan.graph.transfers import account, regions, transfer_section

    graphs = {} if graphs is None else graphs
    if (key := tuple(verdicts)) not in graphs:
        graphs[key] = build_graph(trace, view, verdicts)
        graphs[key].graph["transfers"] = account(graphs[key])  # per-call copies for the GraphML export
    g = graphs[key]
    transfers = g.graph["transfers"]
    findings = sorted((i for i, r in enumerate(rows) if r.verdict.rank > 0), key=lambda i: -rows[i].verdict.rank)
    lane = decide_lane(rows, transfer_reasons(transfers, rows), (memory or {}).get("lane"), source)
    return {"lane": lane, "step_graph": g,
            "graph": {**graph_section(g, transfers, findings), "source": source.value},
            "transfers": {**transfer_section(transfers, regions(g, transfers)), "source": source.value}}


def run_trace(target, options: ScanOptions, kb, trackers: list | None = None):
    """Trace the step as MPS would dispatch it, turning the user's own failures into StepError;
    with `trackers`, a memory tracker runs below the recorder and is appended to that list."""
    from opscan.predict.calls import has_mps_kernel, should_expand
    from opscan.trace import TraceOptions, trace_step
    from opscan.trace.guard import user_step
    from opscan.trace.moves import explicit_moves

    trace_options = TraceOptions(options.inference, options.dtype, options.fx, macos=kb.macos)
    with user_step(target.spec), explicit_moves():
        return trace_step(target, trace_options, has_mps_kernel=has_mps_kernel(kb), expand=should_expand(kb),
                          memory=_tracking(trackers))


def _tracking(trackers: list | None):
    if trackers is None:
        return None
    from opscan.memory.stage import tracking

    return tracking(trackers)


def _fake_choice(options: ScanOptions):
    from opscan.trace.fake import FakeChoice

    return FakeChoice(force=options.fake, auto=options.auto_fake, dtype=options.dtype, inference=options.inference)


def collect_rows(view, verdicts) -> list[tuple[RowUse, Classification]]:
    """Group MPS-view calls by (OpKey, input dtypes) in first-seen order; the worst verdict wins."""
    groups: dict[tuple, list] = {}
    for call, found in zip(view, verdicts):
        groups.setdefault((call.op, call.dtypes), []).append((call, found))
    return [(_use(op, dtypes, [c for c, _ in group]), max((f for _, f in group), key=lambda f: f.verdict.rank))
            for (op, dtypes), group in groups.items()]


def _use(op, dtypes, calls) -> RowUse:
    shapes = tuple(dict.fromkeys(c.inputs[0].shape for c in calls if c.inputs and -1 not in c.inputs[0].shape))
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


def _assumptions(torch_version: str, kb, measurement=None) -> dict[str, Any]:
    measured_on = {} if measurement is None else {"measured_on": measurement.where.label}
    return {
        "torch_release": kb.release,
        "installed_torch": torch_version,
        "macos": ".".join(map(str, kb.macos)),
        "macos_source": kb.macos_source,
        "kb_entry": kb.origin if kb.entry is None else f"{kb.origin}: releases/{kb.entry}",
        "notes": list(kb.notes) + _what_if(torch_version, kb),
        "chip": "any Apple Silicon (M1 or newer)",
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
