"""Trace stage: record every aten call of a model's training step.

`trace_step(target, options)` runs forward, loss, backward and the optimizer step under a
TorchDispatchMode and returns an immutable `Trace`: OpKey, phase, module, tensor metadata and fx
node of every call, bookkeeping calls kept but flagged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from opscan.opkey import OpKey
from opscan.target.load import Target
from opscan.target.seeds import seed_generators
from opscan.trace import collector, fake, fxnodes, repeat, step
from opscan.trace.amp import AmpTrace
from opscan.trace.device_calls import STEP, DeviceCalls, DeviceCode, answering_as_mac
from opscan.trace.frames import Sites
from opscan.trace.attribution import GradFnMapper, ModuleTracker, PhaseTracker
from opscan.trace.lens import Lens
from opscan.trace.questions import Questions
from opscan.trace.functions import StepFunctions
from opscan.trace.host import CompositeMoves, DeviceMoves, HostFactories
from opscan.trace.moves import ExplicitMoves
from opscan.trace.recorder import CallRecorder
from opscan.trace.records import FxInfo, OpCall, TensorMeta, Trace
from opscan.trace.registrations import registrations
from opscan.trace.replicate import Shortcut

log = logging.getLogger("opscan")

__all__ = ["TraceOptions", "trace_step", "Trace", "OpCall", "TensorMeta", "FxInfo"]


@dataclass(frozen=True)
class TraceOptions:
    """How to run the step: training or inference, dtype cast, fx node tagging, assumed macOS."""

    inference: bool = False
    dtype: str | None = None
    fx: bool = True
    seed: int = 0
    macos: tuple[int, int] = (14, 0)
    release: tuple[int, int] | None = None  # the predicted-for release series (None: the installed torch's code)
    repeat: bool = True  # repeated layers traced once (repeat.py; fake tensors only): False traces every layer


def _never(op: OpKey) -> bool:
    return False


def trace_step(target: Target, options: TraceOptions = TraceOptions(), *,
               has_mps_kernel: Callable[[OpKey], bool] | None = None,
               expand: Callable[[OpKey], bool] = _never, memory: Callable | None = None,
               spans: frozenset[str] = frozenset(), amp=None) -> Trace:
    """Run the target's step once under the recorder and return what was dispatched.

    `has_mps_kernel(op)` turns the lens on for the predicted-for release (a row that needs an MPS kernel
    applies when that release has it); None leaves the lens's rows off;
    `expand(op)` names the composites whose callees should be recorded (see recorder.py);
    `spans`: CompositeImplicitAutograd ops (yaml names) whose calls the lens records as "span" groups (lens.py).
    The defaults record the plain CPU trace; every answer these give is kept in `Trace.asked` (questions.py).
    A target built with fake tensors (`target.fake`) is traced inside the same FakeTensorMode.
    `memory(model, inputs, clock)`, when given, returns a storage tracker (opscan.memory.tracker.track_step)
    that the recorder hands every call it passes on, as a dispatch mode below it would see them; `clock()` is
    the index of the call being recorded. `amp` (knowledge/autocast.py's AmpAnswers): the release's answers to the
    mixed-precision questions; given, autocast regions and GradScaler are traced as a Mac runs them (amp.py).
    """
    with collector.spared(), fake.entered(target.fake):  # the imports and the model outlive the trace
        try:
            return _trace(target, options, has_mps_kernel, expand, memory, spans, amp)
        except repeat.Retrace as retry:  # the short run did not prove its layers repeat: every layer runs
            log.info("%s", retry.note)
            options = dataclasses.replace(options, repeat=False)
            found = _trace(target, options, has_mps_kernel, expand, memory, spans, amp)
            return dataclasses.replace(found, notes=(*found.notes, retry.note))


def _trace(target: Target, options: TraceOptions, has_mps_kernel, expand, memory=None, spans=frozenset(),
           amp=None) -> Trace:
    """The step traced as a Mac runs it: device queries answered as there, its CUDA calls recorded (device_calls.py)."""
    devices = DeviceCalls(STEP, Sites(target.anchor), torch.device(_device_of(target.model)))
    with answering_as_mac(devices):
        found = _trace_as_mac(target, options, has_mps_kernel, expand, memory, spans, amp, devices)
    return dataclasses.replace(found, device_calls=devices.calls())


def _trace_as_mac(target: Target, options: TraceOptions, has_mps_kernel, expand, memory, spans, amp,
                  devices: DeviceCalls) -> Trace:
    seed_generators(options.seed)
    code = DeviceCode(devices)  # the user's code that picks a device: in a mode of its own while the step is
    with StepFunctions((code,)):  # prepared (fx, build_optimizer), the last job of the step's mode while it runs
        model, inputs = _prepared(target, options)
        graph, fx_info = fxnodes.symbolic(model) if options.fx else (None, FxInfo(False, "disabled (--no-fx)"))
        shortcut = Shortcut.of(model, graph, options.repeat and target.fake is not None)
        optimizer = None if options.inference else step.make_optimizer(model, target.build_optimizer)
    tracker = ModuleTracker(model)
    mapper = GradFnMapper(tracker)
    phases = PhaseTracker(tracker)
    # what the trace asks of the release, kept
    release = Questions(has_mps_kernel, expand, options.macos, amp, options.release)
    recorder = CallRecorder(tracker, mapper, phases, release.expands)
    recorder.sites.anchor = target.anchor  # the factory: the CallSite of a call no line of the user's made
    lens = Lens(release, clock=lambda: len(recorder.calls), tracker=tracker, paused=lambda: recorder.expanding,
                spans=spans, gate=contextlib.nullcontext())  # the step's one function mode is the lens's gate
    recorder.index_parameters(model)
    hooks = tuple(h for h in (target.train_step, target.loss_fn, target.build_optimizer) if h is not None)
    moved = target.device_tensors(model, inputs) if target.device_tensors else ()  # the user's own code moves them
    recorder.index_placement(model, inputs, hooks, moved)
    below = memory(model, inputs, lambda: len(recorder.calls) - 1) if memory else None
    recorder.below = below
    notes: list[str] = list(shortcut.notes)
    with contextlib.ExitStack() as stack:
        attached = below.attached() if below is not None else contextlib.nullcontext()
        mixed = AmpTrace(release, notes, recorder, devices=devices) if amp is not None else contextlib.nullcontext()
        functions = StepFunctions((*_jobs(mapper, graph, tracker, recorder), code))
        for ctx in (tracker, phases, lens, functions, attached, recorder, mixed):
            stack.enter_context(ctx)
        if target.fake is not None:
            stack.enter_context(fake.stop_on_data_dependence(notes, recorder.calls))
        stack.enter_context(shortcut.running(recorder, below))
        _run(target, model, optimizer, inputs, options)
    calls, groups = shortcut.assembled(recorder, lens.groups, below, notes)
    if target.fake is not None:
        notes.extend(fake.unknown_sizes(calls))
    return Trace(
        calls=calls,
        model_class=type(model).__name__,
        mode="inference" if options.inference else "train",
        modules=tuple((path, type(m).__name__) for path, m in model.named_modules()),
        fx=fx_info,
        torch_version=str(torch.__version__),
        device=_device_of(model),
        groups=groups,
        notes=tuple(notes),
        asked=release.asked(),
        registrations=registrations(c.op for c in calls),
        hosts=tuple(recorder.storages.placement.sources),
    )


def _jobs(mapper, graph, tracker, recorder) -> tuple:
    """The jobs of the step's one TorchFunctionMode (trace/functions.py), outermost first: the autograd nodes'
    modules, the fx node tags (when fx traced the model), factories made on the host, the user's own moves to the
    device, explicit host moves."""
    tagger = (fxnodes.FxNodeTagger(graph, tracker, recorder),) if graph is not None else ()
    return (mapper, *tagger, HostFactories(recorder.storages), DeviceMoves(recorder.storages),
            CompositeMoves(recorder.storages), ExplicitMoves(recorder.storages))


def _prepared(target: Target, options: TraceOptions):
    model, inputs = target.model, target.inputs
    if options.dtype:
        dtype = getattr(torch, options.dtype)
        model = model.to(dtype)
        inputs = step.cast_floating(inputs, dtype)
    model.eval() if options.inference else model.train()
    return model, inputs


def _run(target: Target, model, optimizer, inputs, options: TraceOptions) -> None:
    if options.inference:
        step.run_inference(model, inputs)
    else:
        step.run_train_step(model, optimizer, inputs, target.train_step, target.loss_fn)


def _device_of(model: torch.nn.Module) -> str:
    param = next(iter(model.parameters()), None)
    return str(param.device) if param is not None else "cpu"
