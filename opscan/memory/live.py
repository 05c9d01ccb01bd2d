"""Memory stage (live): `--memory --device D` runs a few real iterations of the step and logs memory.

The target is built again with real tensors and moved to the device; the step (the target's
`train_step`, else forward, loss, backward, optimizer step, zero_grad) runs `iterations` times on the
same inputs. The device's counters (counters.py) are read when the model's forward returns, when the
optimizer is about to step (loss and backward done), after it stepped, and at the end of each
iteration; a StorageTracker counts the live storages meanwhile and remembers which op made each.

Growth: the counter named in counters.GROWTH_COUNTER, at the end of each iteration. Iteration 1 is
left out (the optimizer allocates its state there: AdamW's two moments are not a leak), so from the end
of iteration 2 on, every iteration must add bytes, GROWTH_MIN or more on average, to be flagged as
growing. Suspects: storages made in an iteration from the second to the one before last that are
still alive at the end, and are not parameters, inputs, gradients or optimizer state — grouped by
the op and phase that made them, largest first.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import optimizer as optim_hooks

from opscan.errors import OpscanError
from opscan.memory.counters import GROWTH_COUNTER, READERS
from opscan.memory.tracker import StorageTracker, track_step
from opscan.trace import step
from opscan.trace.attribution import ModuleTracker, PhaseTracker
from opscan.trace.records import PHASES

GROWTH_MIN = 1  # bytes per iteration, on average: tracked bytes are exact, and one kept loss is 4 bytes
_SLOTS = 8  # clock = iteration * _SLOTS + phase index


class LiveDeviceError(OpscanError):
    """The device asked for with --memory --device cannot be used here."""


@dataclass(frozen=True)
class LiveOptions:
    """Where and how long to run: device, iterations (3 or more), and the scan's dtype and mode."""

    device: str = "cpu"
    iterations: int = 5
    dtype: str | None = None
    inference: bool = False


def live_section(spec: str, args: dict, input_texts, options: LiveOptions, ctx=None) -> dict[str, Any]:
    """Load the target with real tensors and log `options.iterations` iterations on the device (`ctx`: the
    run's RunContext)."""
    from opscan.target.inputs import parse_input
    from opscan.target.load import load_target
    from opscan.trace.guard import user_step

    target = load_target(spec, args, [parse_input(t) for t in input_texts], ctx=ctx)
    with user_step(spec, ctx=ctx):
        return run_live(target, options)


def run_live(target, options: LiveOptions) -> dict[str, Any]:
    """The live log of one target (see the module docstring)."""
    device = _device(options.device)
    model = target.model.to(device)
    inputs = _to(target.inputs, device, options.dtype)
    if options.dtype:
        model = model.to(getattr(torch, options.dtype))
    optimizer = None if options.inference else step.make_optimizer(model, target.build_optimizer)
    modules = ModuleTracker(model)
    phases = PhaseTracker(modules)
    now = [0]
    tracker = track_step(model, inputs, lambda: now[0] * _SLOTS + PHASES.index(phases.current()),
                         ignore_device=None, describe=True)
    samples: list[dict] = []
    read = READERS[device.type]

    def sample(phase: str) -> None:
        samples.append({"iteration": now[0], "phase": phase, **read(tracker)})

    with modules, phases, tracker, _sampling(model, sample):
        for iteration in range(1, options.iterations + 1):
            now[0] = iteration
            _one_step(target, model, optimizer, inputs, options.inference)
            sample("end")
    return analyse(samples, tracker, device.type, options.iterations)


def _one_step(target, model, optimizer, inputs, inference: bool) -> None:
    if inference:
        step.run_inference(model, inputs)
    else:
        step.run_train_step(model, optimizer, inputs, target.train_step, target.loss_fn)


@contextlib.contextmanager
def _sampling(model, sample):
    """Read the counters when the model's forward returns and around each optimizer step."""
    handles = [model.register_forward_hook(lambda *_: sample("forward")),
               optim_hooks.register_optimizer_step_pre_hook(lambda *_: sample("backward")),
               optim_hooks.register_optimizer_step_post_hook(lambda *_: sample("optimizer"))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def analyse(samples: list[dict], tracker: StorageTracker, device: str, iterations: int) -> dict[str, Any]:
    """Growth across iterations and the suspects, from the samples and the tracker's blocks."""
    counter = GROWTH_COUNTER[device]
    ends = [s[counter] for s in samples if s["phase"] == "end"]
    deltas = [b - a for a, b in zip(ends[1:], ends[2:])]
    growing = bool(deltas) and all(d > 0 for d in deltas) and sum(deltas) / len(deltas) >= GROWTH_MIN
    suspects = find_suspects(tracker, iterations)
    return {"device": device, "iterations": iterations, "samples": samples,
            "growth": {"counter": counter, "end_of_iteration": ends, "deltas_from_iteration_2": deltas,
                       "growing": growing, "text": _growth_text(growing, deltas, counter)},
            "suspects": suspects, "hint": _hint(suspects) if growing else None}


def find_suspects(tracker: StorageTracker, iterations: int, top: int = 10) -> list[dict[str, Any]]:
    """Storages made in iterations 2 .. N-1 and alive at the end, grouped by op, phase, dtype and shape."""
    timeline = tracker.timeline()
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0, None])
    for i in timeline.alive_at_end():
        block = timeline.blocks[i]
        iteration, slot = divmod(block.clock, _SLOTS)
        if block.role or not 2 <= iteration < iterations:
            continue
        op, shape = tracker.details.get(i, ("?", ()))
        entry = groups[(op, PHASES[slot], block.dtype, shape)]
        entry[0] += 1
        entry[1] += block.nbytes
        entry[2] = iteration if entry[2] is None else min(entry[2], iteration)
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"op": op, "phase": phase, "dtype": dtype, "shape": list(shape), "count": n, "bytes": nbytes,
             "first_iteration": first} for (op, phase, dtype, shape), (n, nbytes, first) in ranked]


def _growth_text(growing: bool, deltas: list[int], counter: str) -> str:
    if not deltas:
        return "too few iterations to judge growth (3 or more are needed)"
    mean = sum(deltas) / len(deltas)
    if growing:
        return (f"growing: {counter} rises by {mean:.0f} bytes per iteration on average from iteration 2 on "
                "(something keeps tensors alive across steps)")
    return f"steady from iteration 2 on ({counter} changes by {mean:+.0f} bytes per iteration on average)"


def _hint(suspects: list[dict]) -> str:
    phases = {s["phase"] for s in suspects}
    if "forward" in phases or "backward" in phases:
        return ("tensors the forward made outlive their step: an output or a loss kept with its autograd graph "
                "holds every activation saved for backward — keep loss.item() or loss.detach() instead")
    if "loss" in phases:
        return ("a tensor of each step's loss is kept (e.g. losses.append(loss)), and its autograd graph with it "
                "— keep loss.item() instead")
    return "tensors made by the optimizer outlive their step — check what the step stores between iterations"


def _device(name: str) -> torch.device:
    available = {"cpu": lambda: True, "cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if name not in available:
        raise LiveDeviceError(f"--device {name!r} is not one of cpu, cuda, mps — pick one of them")
    if not available[name]():
        raise LiveDeviceError(f"--memory --device {name}: {name} is not available on this machine — run on a "
                              f"machine that has it, or log the step on the CPU with --device cpu")
    return torch.device(name)


def _to(value, device: torch.device, dtype: str | None):
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        return value.to(getattr(torch, dtype)) if dtype and value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _to(v, device, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device, dtype) for v in value)
    return value
