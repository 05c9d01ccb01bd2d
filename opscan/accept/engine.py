"""Accept stage (engine): the acceptance run — target against reference, round trip, lane, verdict.

1. Load TARGET with real tensors on the CPU after torch.manual_seed(seed) (and once more, the same way,
   for the fresh model the checkpoint is reloaded into).
2. Run it on the target device (`--dtype` applies here) and on the reference (float32, the truth), each
   from a copy of the one CPU-built model, inside the placement recorder; the target saves its checkpoint
   and both reload it and continue one step (checkpoint.py). An exception of the target run (an op the
   device does not implement) is a finding: the run stops there, what it captured is compared, exit 1.
   An exception of the reference run is the model's own (StepError, exit 2).
3. Compare (compare.py), name the first divergence, decide the measured lane (lane.py) beside the
   predicted one, and the exit code per --fail-on-lane.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from opscan.accept import checkpoint as ckpt
from opscan.accept.compare import Comparison, compare_runs, first_divergence
from opscan.accept.hooks import numerics
from opscan.accept.run import DeviceRun, prepare, run_device
from opscan.accept.spec import AcceptSpec
from opscan.errors import ExitCode, OpscanError, StepError
from opscan.graph.lanes import LANES
from opscan.trust.read import read_json


class AcceptDeviceError(OpscanError):
    """The target or reference device is not available here."""


@dataclass(frozen=True)
class AcceptOptions:
    """What `opscan accept` was asked to do."""

    target: str
    args: dict = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    device: str = "mps"
    reference: str = "cpu"
    dtype: str = "float32"
    spec: AcceptSpec = field(default_factory=AcceptSpec)
    allow_tf32: bool = False
    perturb: tuple[str, float] | None = None
    fail_on_lane: str = "linux-gpu-first"
    report: str | None = None  # a scan's report.json for the predicted lane
    public_args: tuple[str, ...] = ()  # --public-arg: the --arg names whose values the package records


@dataclass(frozen=True)
class AcceptResult:
    """Everything the acceptance run found (the package and the console table are pure functions of it)."""

    options: AcceptOptions
    model_name: str
    comparisons: tuple[Comparison, ...]
    round_trip: tuple[Comparison, ...]
    target_run: DeviceRun
    reference_run: DeviceRun
    checkpoint: bytes
    lane: Any  # opscan.report.Lane
    predicted: dict | None
    choices: dict[str, Any]
    step_bytes: int

    @property
    def first_divergence(self) -> Comparison | None:
        """The first comparison of the run beyond tolerance."""
        return first_divergence(self.comparisons)

    @property
    def round_trip_failure(self) -> Comparison | None:
        """The first round-trip comparison beyond tolerance."""
        return first_divergence(self.round_trip)

    @property
    def target_failure(self) -> str:
        """Why the target run stopped ("" when it ran to the end)."""
        return self.target_run.failure

    @property
    def failures(self) -> tuple[str, ...]:
        """One line per failure: the target run's exception, the first divergence, the round trip's first."""
        lines = [self.target_failure] if self.target_failure else []
        if self.first_divergence is not None:
            lines.append(f"first divergence: {self.first_divergence.line()}")
        if self.round_trip_failure is not None:
            lines.append(f"checkpoint round trip fails: {self.round_trip_failure.line()}")
        return tuple(lines)

    @property
    def exit_code(self) -> int:
        """1 on any failure or a lane at or beyond --fail-on-lane, else 0."""
        failing = bool(self.failures) or LANES.index(self.lane.name) >= LANES.index(self.options.fail_on_lane)
        return int(ExitCode.FINDINGS if failing else ExitCode.OK)


def check_device(name: str, flag: str) -> None:
    """A one-line AcceptDeviceError when the device cannot be used here.

    Not opscan.probe.stage.check_device: that one refuses indexed devices (cuda:1), and its fixes name probe
    flags (--no-probe) and only --device; here the flag is --device or --reference."""
    available = {"cpu": lambda: True, "cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    kind = name.split(":")[0]
    if kind not in available:
        raise AcceptDeviceError(f"{flag} {name!r} is not one of cpu, cuda, mps — pick one of them")
    if not available[kind]():
        raise AcceptDeviceError(f"{flag} {name}: {kind} is not available on this machine — run on a machine "
                                f"that has it (mps: a Mac; cuda: a GPU machine), or pass {flag} cpu")


def accept(options: AcceptOptions, default_report: Callable[[str], str] | None = None, ctx=None) -> AcceptResult:
    """Run the acceptance (see the module docstring).

    default_report: the model name -> the scan's report.json read when --report is not given (the CLI
    passes reports/<safe name>/report.json, the scan's folder); None: only --report. ctx: the run's
    RunContext (target/run.py; a fresh one when None)."""
    from opscan.target.run import RunContext
    from opscan.trace.guard import user_step

    ctx = ctx or RunContext()

    check_device(options.device, "--device")
    check_device(options.reference, "--reference")
    if options.report:
        _predicted(options.report, required=True)  # a --report that is not a scan's report fails before the run
    spec = options.spec
    with numerics(options.allow_tf32):
        target, fresh = _load(options, ctx), _load(options, ctx).model
        with ctx.running(f"the acceptance run on {options.device}"):
            target_run, blob = _target_run(options, target, fresh)
        with user_step(options.target, f"the reference run on {options.reference}", ctx):
            reference_run = _reference_run(options, target, fresh, blob)
    comparisons = compare_runs(target_run, reference_run, spec, stopped=bool(target_run.failure))
    step_bytes = _step_bytes(target, target_run)
    report = options.report or (default_report(target.name) if default_report else None)
    result = AcceptResult(options, target.name, comparisons, _round_trip(options, target, target_run, reference_run),
                          target_run, reference_run, blob, None, _predicted(report, bool(options.report)),
                          _choices(options, target_run), step_bytes)
    return _with_lane(result)


def _round_trip(options: AcceptOptions, target, target_run: DeviceRun, reference_run: DeviceRun) -> tuple:
    """The round trip's comparisons; none when the target run stopped before it continued the original."""
    original = next((c for c in target_run.checkpoint if c.side == "original"), None)
    if original is None:
        return ()
    reloaded = (*(c for c in target_run.checkpoint if c.side != "original"), *reference_run.checkpoint)
    persistent = set(target.model.state_dict())
    return ckpt.compare_round_trip(original, reloaded, options.dtype, options.spec, persistent)


def _load(options: AcceptOptions, ctx):
    """The target with real tensors, built on the CPU after seeding."""
    from opscan.target.inputs import parse_input
    from opscan.target.load import load_target

    torch.manual_seed(options.spec.seed)
    return load_target(options.target, options.args, [parse_input(t) for t in options.inputs], ctx=ctx)


def _target_run(options: AcceptOptions, target, fresh) -> tuple[DeviceRun, bytes]:
    """The target's run (it saves the checkpoint, b"" when it stopped before); its exceptions are kept."""
    from opscan.accept.placement import Placement, PlacementRecorder
    from opscan.accept.run import describe_failure
    from opscan.trace.guard import _raised_by_opscan

    n, saved = options.spec.iterations, {"blob": b""}

    def after_target(session):
        saved["blob"] = ckpt.save(session)
        original = ckpt.continue_original(session, n + 1)
        again = ckpt.fresh_session(target, fresh, session.device, session.dtype)
        return (original, ckpt.reload_and_continue(saved["blob"], again, "target", n + 1))

    try:
        mine = prepare(target, options.device, options.dtype, perturb=options.perturb)
    except Exception as exc:  # noqa: BLE001 - moving the model there failed: a finding, like a failing op
        if isinstance(exc, OpscanError) or _raised_by_opscan(exc):
            raise
        reason = describe_failure(exc, options.device, ("moving the model there", 0))
        return DeviceRun(options.device, options.dtype, (), {}, 0, Placement({}, (), (), (), options.device),
                         {"modules": 0, "functional_calls": 0}, failure=reason), b""
    recorder = PlacementRecorder(mine.model, options.device)
    return run_device(mine, n, options.spec.seed, recorder, after_target, catch=True), saved["blob"]


def _reference_run(options: AcceptOptions, target, fresh, blob: bytes) -> DeviceRun:
    """The reference's run; it reloads the target's checkpoint when there is one."""
    from opscan.accept.placement import PlacementRecorder

    n = options.spec.iterations

    def after_reference(session):
        again = ckpt.fresh_session(target, fresh, session.device, session.dtype)
        return (ckpt.reload_and_continue(blob, again, "reference", n + 1),)

    theirs = prepare(target, options.reference, "float32")
    run = run_device(theirs, n, options.spec.seed, PlacementRecorder(theirs.model, options.reference),
                     after_reference if blob else None, catch=True)
    if run.failure:  # nothing to compare against: where it failed (iteration, phase, device) is the message
        raise StepError(f"the reference run failed: {run.failure} — the reference must run the step: check that "
                        "the inputs fit the model (--input, example_inputs()), or pass another --reference")
    return run


def _with_lane(result: AcceptResult) -> AcceptResult:
    from dataclasses import replace

    from opscan.accept.lane import measured_lane

    return replace(result, lane=measured_lane(result.failures, result.target_run.placement, result.step_bytes))


def _step_bytes(target, run: DeviceRun) -> int:
    """Parameters and buffers of the model plus the activations of the first forward (module outputs)."""
    model = target.model
    state = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return state + run.activation_bytes


def _choices(options: AcceptOptions, run: DeviceRun) -> dict[str, Any]:
    """What was chosen for the run, said in the result and the package."""
    dropout = run.dropout
    return {
        "seed": options.spec.seed,
        "iterations": options.spec.iterations,
        "target_dtype": options.dtype,
        "reference_dtype": "float32",
        "dropout": (f"disabled on both devices: {dropout['modules']} dropout module(s) set to p=0 and "
                    f"{dropout['functional_calls']} functional dropout call(s) forced to p=0 (identical masks "
                    "cannot be drawn from two devices' own generators)"),
        "tf32": "allowed (--allow-tf32)" if options.allow_tf32 else "off (cuda matmul and cuDNN)",
        "deterministic": "cuDNN deterministic, benchmark off, float32 matmul precision "
                         + ("high" if options.allow_tf32 else "highest"),
        "initial_weights": "built once on the CPU after torch.manual_seed(seed), copied to both devices",
        "perturb": (f"{options.perturb[0]} += {options.perturb[1]:g} on the target only (self-test)"
                    if options.perturb else None),
    }


def _predicted(path: str | None, required: bool) -> dict | None:
    """The predicted lane of a scan's report.json (--report: required; else the default, when present)."""
    if not path:
        return None
    if not os.path.isfile(path):
        if required:
            raise OpscanError(f"--report {path!r} does not exist — pass a scan's report.json or leave --report out")
        return None
    fix = "rerun the scan or pass another --report"
    report = read_json(path, "--report", fix, expected="a scan's report.json", error=OpscanError)
    lane = report.get("lane") if isinstance(report, dict) else None
    reasons = lane.get("reasons", []) if isinstance(lane, dict) else None
    if not isinstance(lane, dict) or not isinstance(lane.get("name"), str) or not isinstance(reasons, list) \
            or not all(isinstance(r, str) for r in reasons):
        raise OpscanError(f"{path} is not a scan's report.json (no lane in it) — {fix}")
    return {"name": lane["name"], "reasons": list(reasons), "report": path}
