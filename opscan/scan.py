"""Pipeline: compose target -> trace -> mps_view -> predict -> [probe] -> graph -> report. Nothing else lives here.

`prepare` loads the knowledge base and the target and traces the step; `scan` runs every later stage on it —
memory, predict (the release's view and verdicts, since and upgrade), probe, the report's rows, graph and lane,
device code — and the report stage only assembles what they made (opscan/report/assemble.py build_report).
Each run of the target's code is a stage of the run's RunContext (target/run.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from opscan.graph.stage import GraphMemo
from opscan.predict.memo import PredictMemo
from opscan.report import Report
from opscan.verdict import Source


@dataclass(frozen=True)
class ScanOptions:
    """What to scan and how (mirrors the CLI flags; a bundle stores them: opscan/bundle/options.py)."""

    target: str
    inputs: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    public_args: tuple[str, ...] = ()  # --public-arg: the --arg names whose values a recorded command line keeps
    inference: bool = False
    dtype: str | None = None
    fx: bool = True
    yaml_path: str | None = None  # a native_functions.yaml other than the installed wheel's
    fake: bool = False  # build and trace with fake tensors (trace/fake.py)
    auto_fake: bool = True  # ... or switch to them when a meta pre-pass says the step would not fit in RAM
    torch_version: str | None = None  # predict for this release (default: the installed one)
    macos: str | None = None  # assume this macOS (default: the release's minimum)
    chip: str | None = None  # assume this chip family, "M1".."M5" (default: any; chip-limited silent bugs are notes)
    probe: Any = None  # opscan.probe.stage.ProbeOptions: measure every distinct call (measured mode)
    memory: bool = True  # estimate the step's memory and size it for Macs (opscan/memory)
    live: Any = None  # opscan.memory.live.LiveOptions: --memory, a few real iterations on a device
    repro: bool = False  # add the `repro` section: what standalone repro scripts of the findings need
    repeat: bool = True  # trace repeated layers once (trace/repeat.py; fake tensors only); False: every layer


@dataclass(frozen=True)
class Prepared:
    """What every later stage starts from: the knowledge base, the loaded target, its trace and MPS view."""

    kb: Any
    target: Any
    trace: Any
    view: Any
    tracker: Any = None  # the memory tracker that ran below the recorder, when options.memory
    # what the predict stage judged of this trace (predict/memo.py PredictMemo) and the graph stage's graphs of it
    # (graph/stage.py GraphMemo): scans of this trace for several releases (opscan/zoo/releases.py) share them
    judged: PredictMemo = field(default_factory=PredictMemo)
    graphs: GraphMemo = field(default_factory=GraphMemo)
    notes: tuple[str, ...] = ()  # what the predict stage changed in the view for kb's release (release_paths.py)


def prepare(options: ScanOptions, ctx=None) -> Prepared:
    """Load the knowledge base and the target, trace the step, and build its MPS view (`ctx`: the run's
    RunContext, target/run.py; a fresh one when None)."""
    from opscan.knowledge import load_knowledge
    from opscan.target.inputs import parse_input
    from opscan.target.load import load_target
    from opscan.target.run import RunContext

    ctx = ctx or RunContext()
    ctx.progress("loading the knowledge base")
    kb = load_knowledge(yaml_path=options.yaml_path, release=options.torch_version, macos=options.macos,
                        chip=options.chip)
    inputs = [parse_input(t) for t in options.inputs]
    ctx.progress(f"loading {options.target}")
    target = built_as_mac(lambda: load_target(options.target, options.args, inputs, _fake_choice(options), ctx))
    return prepare_loaded(target, options, kb, ctx)


def built_as_mac(load):
    """The Target `load()` returns, built as a Mac runs its code — device queries answered as there, its code that
    picks a device recorded in `Target.device_calls` (trace/device_calls.py) — so that a host with CUDA builds the
    model a Mac builds."""
    from opscan.trace.device_calls import BUILD, DeviceCalls, as_mac

    calls = DeviceCalls(BUILD)
    with as_mac(calls):
        target = load()
    calls.imported(target.project)
    return replace(target, device_calls=calls.calls())


def prepare_loaded(target, options: ScanOptions, kb, ctx=None) -> Prepared:
    """prepare() for a target already loaded (target.load.Target; opscan.api builds one from objects in memory):
    trace its step against `kb` and build the MPS view."""
    from opscan.mps_view import mps_view

    if ctx is not None:
        ctx.progress(f"tracing the step of {options.target}")
    trace, tracker = _trace(target, options, kb, ctx, options.memory)
    if ctx is not None:
        ctx.progress("building the MPS view")
    return Prepared(kb, target, trace, mps_view(trace), tracker)


def scan(options: ScanOptions, session=None, prepared: Prepared | None = None, ctx=None) -> Report:
    """Run the whole scan of one target — predicted, and measured when `options.probe` — and return its Report
    (`prepared`: reuse a trace that prepare(options) already made, as `opscan bundle` does after planning its
    probes; `session` (probe.stage.Session) journals the probes in the report folder and draws the progress bar;
    `ctx`: the run's RunContext, target/run.py; a fresh one when None)."""
    from opscan.target.run import RunContext
    from opscan.trace import collector

    ctx = ctx or RunContext()
    prepared = prepared or prepare(options, ctx)
    with collector.spared():  # the trace, the model and the imports outlive every later stage (trace/collector.py)
        try:
            return _stages(options, session, prepared, ctx)
        finally:
            ctx.progress(None)


def _stages(options: ScanOptions, session, prepared: Prepared, ctx) -> Report:
    from opscan.graph.stage import graph_stage
    from opscan.predict.device_code import device_findings
    from opscan.predict.history import since_and_upgrade
    from opscan.report.assemble import Stages, build_report, report_rows, stands_for_mps

    memory = memory_stage(prepared, options, ctx)  # sizes of the traced step, whichever release is judged
    ctx.progress(f"judging {len(prepared.view):,} calls for torch {prepared.kb.release}")
    prepared, predicted = predict_stage(prepared, measured=options.probe is not None)
    kb, target, trace, view = prepared.kb, prepared.target, prepared.trace, prepared.view
    measurement = None
    if options.probe is not None:
        from opscan.probe.stage import measure

        ctx.progress(None)  # the probes draw their own bar
        measurement = measure(trace, view, options.probe, target.name, session)
    ctx.progress("judging the other releases, building the step graph and the lane")
    since, upgrade = since_and_upgrade(view, predicted, kb, prepared.judged)
    rows = report_rows(prepared, predicted, since, measurement)
    verdicts, source = stands_for_mps(predicted, measurement)
    stages = Stages(predicted, rows, upgrade, memory, measurement,
                    graph_stage(trace, view, verdicts, rows, memory, source, prepared.graphs),
                    device_findings((*getattr(target, "device_calls", ()), *getattr(trace, "device_calls", ())),
                                    kb.release))
    report = build_report(prepared, options.target, stages)
    ctx.progress("writing what the repro scripts need" if options.repro else None)
    command = repro_command(options)
    return report if command is None else with_repro(report, trace, view, command, measurement)


def predict_stage(prepared: Prepared, measured: bool = False) -> tuple[Prepared, list]:
    """(prepared with the view of kb's release, the predicted verdict of each of its calls). Measured mode
    measures the installed torch's own calls as traced; predicted mode judges the view as kb's release runs its
    C++ composites (predict/release_paths.py) and its Python code (predict/python_paths.py)."""
    from opscan.predict.calls import predict_call

    paths = None
    if not measured:
        prepared = for_release(prepared)
        prepared, paths = _release_paths(prepared)
    cache = prepared.judged.verdicts(prepared.kb)
    predicted = [predict_call(call, prepared.kb, cache) for call in prepared.view]
    if paths is not None:
        from opscan.predict.python_paths import judged

        predicted = judged(paths, predicted)
    return prepared, predicted


def for_release(prepared: Prepared) -> Prepared:
    """`prepared` with its MPS view as kb's release runs its C++ composites (predict/release_paths.py), and notes
    saying what changed; itself when nothing does (the release the step was traced with)."""
    from dataclasses import replace

    from opscan.predict.release_paths import release_view

    view, notes = release_view(prepared.trace, prepared.view, prepared.kb)
    return prepared if view is prepared.view and not notes else replace(prepared, view=view, notes=notes)


def _release_paths(prepared: Prepared):
    """(prepared with the MPS view and notes of its knowledge base's release, the ReleasePaths:
    predict/python_paths.py); one per (trace, release) in prepared.judged."""
    paths = prepared.judged.paths(prepared.trace, prepared.view, prepared.kb)
    if paths.view is prepared.view and not paths.notes:
        return prepared, paths
    trace = replace(prepared.trace, notes=prepared.trace.notes + paths.notes)
    return replace(prepared, trace=trace, view=paths.view), paths


def repro_command(options: ScanOptions) -> str | None:
    """The command line recorded in the `repro` section, or None when no section is wanted."""
    from opscan.repro.section import command_line

    return command_line(options) if options.repro else None


def with_repro(report: Report, trace, view, command: str, measurement=None) -> Report:
    """The report with its `repro` section (opscan/repro/section.py): from the measured plan and outcomes,
    or in predicted mode from a plan of the MPS view's calls at full shapes."""
    from opscan.probe.calls import plan
    from opscan.repro.section import section

    if measurement is None:
        found = section(report.rows, plan(trace, view, "mps", None), command=command)
    else:
        found = section(report.rows, measurement.plan, measurement.result, measurement.section["device"], command)
    source = Source.PREDICTED if measurement is None else Source.MEASURED
    return replace(report, repro={**found, "source": source.value})


def memory_stage(prepared: Prepared, options: ScanOptions, ctx=None) -> dict[str, Any] | None:
    """The report's `memory` section (opscan/memory): estimate, Mac sizing, and with `live` real iterations."""
    if prepared.tracker is None:
        return None
    from opscan.memory.stage import estimate_memory
    from opscan.target.run import RunContext

    ctx = ctx or RunContext()
    target, trace, view, kb = prepared.target, prepared.trace, prepared.view, prepared.kb
    with ctx.running(f"sizing the memory of {options.target}'s step at larger batches"):  # the step runs again
        section = estimate_memory(target, trace, view, kb, prepared.tracker, options.dtype, options.inference,
                                  options.repeat)
    if options.live is not None:
        from opscan.memory.live import live_section

        section["live"] = live_section(options.target, options.args, options.inputs, options.live, ctx)
    return section


def run_trace(target, options: ScanOptions, kb, ctx=None, *, memory: bool = False):
    """Trace the step as MPS would dispatch it, turning the user's own failures into StepError (the memory tracker
    below the recorder only with `memory`, as prepare() runs it when options.memory; the trace either way)."""
    return _trace(target, options, kb, ctx, memory=memory)[0]


def _trace(target, options: ScanOptions, kb, ctx, memory: bool) -> tuple[Any, Any]:
    """(the trace, the memory tracker that ran below its recorder, or None without `memory`)."""
    from opscan.opkey import Release
    from opscan.predict.calls import amp_of, has_mps_kernel, should_expand
    from opscan.predict.release_paths import span_ops
    from opscan.trace import TraceOptions, trace_step
    from opscan.trace.guard import user_step

    made: list = []  # the tracker trace_step's memory factory makes (one, when asked for)
    trace_options = TraceOptions(options.inference, options.dtype, options.fx, macos=kb.macos,
                                 release=Release.parse(kb.release).series_key, repeat=options.repeat)
    with user_step(target.spec, ctx=ctx):
        trace = trace_step(target, trace_options, has_mps_kernel=has_mps_kernel(kb), expand=should_expand(kb),
                           memory=_tracking(made) if memory else None, spans=span_ops(), amp=amp_of(kb))
    return trace, (made[-1] if made else None)  # (the last: a short run that proved nothing is run again)


def _tracking(made: list):
    from opscan.memory.stage import tracking

    return tracking(made)


def _fake_choice(options: ScanOptions):
    from opscan.trace.fake import FakeChoice

    return FakeChoice(force=options.fake, auto=options.auto_fake, dtype=options.dtype, inference=options.inference)
