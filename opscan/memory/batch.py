"""Memory stage: the step at larger batches, for the sizing table (torch; after the trace).

How the batch is varied: the batch is the leading dimension of the input tensors (the most common
one when they differ); every input tensor whose leading dimension equals it is made `k` times longer,
the others are kept. The step then runs at `k` = 2 and 3 on **meta** tensors (no data, no memory;
about 3 s for a 7B step on two cores), else — when the step needs tensor values (`.item()`, masks) —
on fake tensors, with the attention branch MPS takes (lens.py) and the storage tracker only. Two runs
give every allocation event a line `bytes = c + s * batch` (the runs must make the same allocations
in the same order; otherwise the peaks alone are fitted). The runs never use real tensors, so a
fake and a real scan of one model report the same sizing. Batch sizes 2k and 3k avoid batch 1,
where PyTorch's size-1 shortcuts (views instead of copies) change what is allocated.

When an argument is a list of unbatched samples — C x H x W images (a torchvision detector's) or 1-d
sequences — the batch is the list's length instead, and every list of that length among the arguments is
made `k` times longer (the images' own dimensions are kept); the section's `varied` says which.

The optimizer does not run in the sizing runs (a third of their time): its work does not depend on the
batch. `optimizer.step` is replaced by one transient allocation of what the traced step's optimizer
phase added on top of the level it started from (`Estimate.optimizer_excess`), and the optimizer state
the traced step left alive (`Estimate.state`) is counted from the start, as in the steady state.
A step whose code fixes the batch (a loss against targets of one size) can't be scaled: the
sizing table then shows the traced batch only, with the reason.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from opscan.memory.estimate import curve, without_indices
from opscan.memory.short import ShortSizing
from opscan.memory.tracker import track_step
from opscan.target.loaders import in_process_loaders, stderr_aside
from opscan.trace import fake, step
from opscan.trace.amp import AmpTrace
from opscan.trace.call_cache import MetaCache
from opscan.trace.device_calls import STEP, DeviceCalls, as_mac
from opscan.trace.lens import Lens
from opscan.trace.questions import Questions
from opscan.trace.splice import Refused

log = logging.getLogger("opscan")
FACTORS = (2, 3)
LEADING = "the leading dimension of the input tensors"
LIST = "the length of the list of input tensors (e.g. a detector's images)"


@dataclass(frozen=True)
class Run:
    """One sizing run: its batch and the steady-state bytes after each allocation (float32 and bf16)."""

    batch: int
    curve: tuple[int, ...]
    bf16_curve: tuple[int, ...]


@dataclass(frozen=True)
class Scaling:
    """The sizing runs (empty when the batch could not be varied) and how they were made."""

    batch: int | None
    runs: tuple[Run, ...]
    method: str  # meta | fake | none
    note: str | None = None
    varied: str = LEADING  # or LIST: what `batch` counts

    def to_dict(self) -> dict:
        """JSON form (peaks only; the curves stay in memory)."""
        return {"batch": self.batch, "method": self.method, "note": self.note, "varied": self.varied,
                "points": [{"batch": r.batch, "peak_bytes": max(r.curve, default=0),
                            "bfloat16_peak_bytes": max(r.bf16_curve, default=0)} for r in self.runs]}


def batch_of(inputs) -> int | None:
    """The length of a list of same-rank tensors among the model's arguments (a detector's images: the batch is
    the list, not the images' leading dimension), else the leading dimension shared by most input tensors;
    None without either."""
    from opscan.trace.tensors import tensors_in

    listed = tensor_list_length(inputs)
    if listed is not None:
        return listed
    dims = Counter(t.shape[0] for t in tensors_in(inputs) if t.dim() > 0)
    return dims.most_common(1)[0][0] if dims else None


def tensor_list_length(inputs) -> int | None:
    """The length of the first list of unbatched samples among the model's arguments — tensors all of rank 3
    (C x H x W images, torchvision's detection convention) or all of rank 1 (sequences) — or None. The top
    level of a tuple/list input holds the positional arguments themselves; a list of rank-2 or rank-4 tensors
    may hold batched tensors (feature maps), so its tensors' leading dimension stays the batch."""
    arguments = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (tuple, list)) else ()
    for value in arguments:
        for found in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(found, list) and {t.dim() if isinstance(t, torch.Tensor) else None for t in found} in \
                    ({1}, {3}):
                return len(found)
    return None


@dataclass(frozen=True)
class Stand:
    """What the traced step's optimizer adds (bytes above its starting level) and leaves (its state),
    for the sizing runs that skip it."""

    excess: int = 0
    state: int = 0
    state_bf16: int = 0


def scaled_runs(target, dtype: str | None, inference: bool, has_mps_kernel: Callable, macos,
                stand: Stand = Stand(), amp=None, repeat: bool = True) -> Scaling:
    """The step at 2x and 3x the traced batch: on meta tensors, else on fake ones, else not at all; `amp` (the
    release's mixed-precision answers, as the trace had them) makes autocast regions cast as the trace did;
    `repeat`: a stack of repeated layers runs short (short.py)."""
    batch = batch_of(target.inputs)
    if batch is None:
        return Scaling(None, (), "none", "no input tensor has a leading (batch) dimension")
    listed = tensor_list_length(target.inputs) is not None
    errors, printed = [], []
    for method in ("meta", "fake"):
        cache = MetaCache() if method == "meta" else None  # shared: calls on the weights repeat across runs
        try:
            # a DataLoader's workers cannot take fake tensors, and what processes the step starts print (a
            # worker's traceback) is not the user's to read: the trace ran this step in view (target/loaders.py)
            with stderr_aside(printed), in_process_loaders():
                runs = tuple(_run(target, method, k, batch, dtype, inference, (has_mps_kernel, macos, amp), stand,
                                  listed, cache, repeat) for k in FACTORS)
        except Exception as exc:  # noqa: BLE001 - a step that can't be scaled is reported, not fatal
            errors.append(f"{method}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}")
            log.debug("sizing run on %s tensors failed: %s (it printed %r)", method, errors[-1], printed[-1][-2000:])
            continue
        return Scaling(batch, runs, method, varied=LIST if listed else LEADING)
    return Scaling(batch, (), "none", f"the step could not run at batch {batch * FACTORS[0]} ({'; '.join(errors)}): "
                   "its code may fix the batch (e.g. loss targets of one size); the table covers the traced batch",
                   varied=LIST if listed else LEADING)


def _run(target, method: str, k: int, batch: int, dtype, inference: bool, lens, stand: Stand,
         listed: bool = False, cache=None, repeat: bool = False) -> Run:
    build = target.fake if method == "fake" and target.fake is not None else None
    mode = build.mode if build is not None else (fake.new_mode() if method == "fake" else None)
    model = target.model if build is not None else _model_copy(target.model, method, mode)
    with fake.entered(fake.FakeBuild(mode, "sizing") if mode is not None else None):
        inputs = _scaled(target.inputs, k, batch, method, mode) if not listed else \
            _lengthened(target.inputs, k, batch, method, mode)
        if dtype:
            model = model.to(getattr(torch, dtype))
            inputs = step.cast_floating(inputs, getattr(torch, dtype))
        model.eval() if inference else model.train()
        optimizer = None if inference else step.make_optimizer(model, target.build_optimizer)
        tracker = track_step(model, inputs, ignore_device=None, cache=cache)
        if optimizer is not None:
            optimizer.step = _standing_in(tracker, stand.excess, model)
        torch.manual_seed(0)
        amp = lens[2] if len(lens) > 2 else None
        release = Questions(lens[0], macos=lens[1], amp=amp)
        steer = Steer(release, clock=lambda: tracker.calls)
        mixed = AmpTrace(release, [], meta=method == "meta") if amp is not None else contextlib.nullcontext()
        short = ShortSizing.of(model, repeat)
        mac = as_mac(DeviceCalls(STEP, stand_in=_device_of(model)))  # as the trace ran it (device_calls.py)
        with mac, steer, tracker, mixed, short.running(tracker) if short else contextlib.nullcontext():
            if inference:
                step.run_inference(model, inputs)
            else:
                step.run_train_step(model, optimizer, inputs, target.train_step, target.loss_fn)
    if short is not None:
        try:
            if steer.pools:
                raise Refused("max-pool indices are counted by call")
            short.replicate(tracker)
        except Refused as exc:
            log.info("sizing run at batch %d: repeated layers not replicated (%s); every layer run", batch * k, exc)
            return _run(target, method, k, batch, dtype, inference, lens, stand, listed, cache, repeat=False)
    timeline = without_indices(tracker.timeline(batch * k), steer.pools)
    return Run(batch * k, tuple(v + stand.state for v in curve(timeline)),
               tuple(v + stand.state_bf16 for v in curve(timeline, bf16=True)))


def _device_of(model: torch.nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def _standing_in(tracker, excess: int, model: torch.nn.Module):
    """optimizer.step for a sizing run: one transient block of the traced optimizer's excess, in the
    parameters' dtype (so the bfloat16 curve halves it as it halves them)."""
    param = next(model.parameters(), None)
    dtype = str(param.dtype).removeprefix("torch.") if param is not None else "float32"
    return lambda *args, **kwargs: tracker.transient(excess, dtype)


def _model_copy(model: torch.nn.Module, method: str, mode) -> torch.nn.Module:
    """A copy of the model whose parameters and buffers are meta (or fake) tensors; nothing else copied
    but the module objects (deepcopy with the tensors pre-filled in its memo)."""
    memo: dict = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if method == "meta":
            new = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
        else:
            new = mode.from_tensor(t, static_shapes=True)
        memo[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) \
            else new
    return copy.deepcopy(model, memo)


def _scaled(value, k: int, batch: int, method: str, mode=None):
    """Inputs with every tensor whose leading dimension is `batch` made `k` times longer."""
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if shape and shape[0] == batch:
            shape = (batch * k, *shape[1:])
        if method == "meta":
            return torch.empty(shape, dtype=value.dtype, device="meta")
        value = mode.from_tensor(value, static_shapes=True) if mode is not None and not _is_fake(value) else value
        return value.repeat(k, *[1] * (value.dim() - 1)) if shape != tuple(value.shape) else value
    if isinstance(value, dict):
        return {key: _scaled(v, k, batch, method, mode) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scaled(v, k, batch, method, mode) for v in value)
    return value


def _lengthened(value, k: int, batch: int, method: str, mode, top: bool = True):
    """Inputs with every list of `batch` items among the model's arguments made `k` times longer (the images
    repeated), each tensor in meta/fake form and of its own shape."""
    if isinstance(value, list) and not top and len(value) == batch:
        return [_scaled(v, 1, None, method, mode) for v in value] * k
    if isinstance(value, dict):
        return {key: _lengthened(v, k, batch, method, mode, top=False) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_lengthened(v, k, batch, method, mode, top=False) for v in value)
    return _scaled(value, 1, None, method, mode)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class Steer(Lens):
    """The lens (lens.py), which steers attention onto the branch MPS takes (with grad the math path: B x H x L x
    L scores), and the calls MPS runs as its own max_pool2d (`pools`: the `clock()` values of their calls)."""

    @property
    def pools(self) -> frozenset[int]:
        return frozenset(i for g in self.groups if g.rule == "mps-max-pool2d" for i in range(g.start, g.end))
