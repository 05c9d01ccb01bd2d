"""Accept stage: where things ran — devices, explicit transfers, CPU fallbacks and memory per phase.

`PlacementRecorder` is entered around one device's run; the engine names each phase with `phase(name,
iteration)` and calls `census(...)` once after the first step. Its modes (modes.py) report to it: a
TorchDispatchMode every copy that crosses devices (`aten::_to_copy`, `copy_`, `_local_scalar_dense` of a
device tensor; bytes = numel × element size of the source) and PyTorch's MPS fallback warning raised by each
call (warn-once defeated, restored after; other warnings are emitted again, once each, at exit; the fallback's
bytes are kept per phase). A TorchFunctionMode names the request behind a copy (`cpu()`, `to('cpu')`,
`tolist()`, `print`, `numpy()`, `item()`, `bool()`, `float()`, `int()`, `to()`, `cuda()`, `copy_()`) and who
made it: the model's code, torch itself, or opscan (never counted). On a CPU
target a host request of the model's code copies nothing, yet on an accelerator it is a device-to-host copy:
it is recorded with `source == destination == "cpu"` (`moved_here` false). Memory: the device's counters
(memory.counters.READERS, a StorageTracker for tensor bytes) at the end of each phase of each iteration.
Modules are paths: the innermost running module in forward, the module that made the autograd node in
backward (trace.attribution), `(model)` for the model itself, "" outside every module.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from opscan.accept.modes import Copies, Requests, copy_ends
from opscan.errors import OpscanError
from opscan.memory.counters import READERS
from opscan.memory.tracker import track_step
from opscan.opkey import OpKey
from opscan.probe.texts import FALLBACK_WARNING
from opscan.trace.attribution import GradFnMapper, ModuleTracker, PhaseTracker, backward_module
from opscan.trace.functions import StepFunctions
from opscan.trace.tensors import tensors_in

ROOT = "(model)"
STEP_PHASES = ("forward", "loss", "backward", "optimizer")  # eval and checkpoint are phases too, not the step
WHOLE_STEP = "step"  # a phase split into the four above as it runs (a target's own train_step)
OUTSIDE = "outside"  # the phase of what runs inside the recorder but outside every phase() block
SYNC_READS = frozenset({"item()", "bool()", "float()", "int()", "aten::_local_scalar_dense"})
_aten = torch.ops.aten


class PlacementDeviceError(OpscanError):
    """The device has no memory reader (cpu, cuda and mps have)."""


@dataclass(frozen=True)
class Transfer:
    """One explicit move, aggregated per (op, source, destination, module, phase) over the iterations."""

    op: str
    source: str
    destination: str
    bytes: int
    module: str
    phase: str
    count: int

    @property
    def sync_read(self) -> bool:
        """A read of one value into Python (`item()`, `bool(t)`...): a sync, a few bytes."""
        return self.op in SYNC_READS

    @property
    def moved_here(self) -> bool:
        """False for a host request on the CPU: nothing crossed in this run (an accelerator would copy)."""
        return self.source != self.destination

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with `kind` (copy | sync_read) and `moved_here`."""
        return {**asdict(self), "kind": "sync_read" if self.sync_read else "copy", "moved_here": self.moved_here}


@dataclass(frozen=True)
class FallbackUse:
    """An op that ran on the CPU through the MPS fallback (or an always-CPU op), with PyTorch's words for it."""

    op: str
    count: int
    modules: tuple[str, ...]
    phases: tuple[str, ...]
    evidence: str
    bytes: int = 0  # what the fallback copied, both directions: the calls' device tensors in, their results out
    phase_bytes: dict = field(default_factory=dict)  # those bytes per phase (eval and checkpoint included)

    @property
    def step_bytes(self) -> int:
        """What it copied in the training step's phases (forward .. optimizer), eval and checkpoint left out."""
        return sum(n for phase, n in self.phase_bytes.items() if phase in STEP_PHASES)


@dataclass(frozen=True)
class Placement:
    """Where one device's run put its tensors and work (see the module docstring)."""

    devices: dict
    transfers: tuple[Transfer, ...]
    fallbacks: tuple[FallbackUse, ...]
    memory: tuple[dict, ...]
    device: str = ""  # the target device of the run
    misplaced: tuple[dict, ...] = ()  # {kind, name, device, bytes}: parameters and optimizer state off target

    @property
    def iterations(self) -> int:
        """How many iterations of the step (forward .. optimizer phases) the memory log covers."""
        return len({m["iteration"] for m in self.memory if m["phase"] in (*STEP_PHASES, WHOLE_STEP)})

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"device": self.device, "devices": self.devices, "misplaced": [dict(m) for m in self.misplaced],
                "transfers": [t.to_dict() for t in self.transfers],
                "fallbacks": [{**asdict(f), "modules": list(f.modules), "phases": list(f.phases)}
                              for f in self.fallbacks],
                "memory": [dict(m) for m in self.memory]}


@dataclass
class _Fallbacks:
    count: int = 0
    bytes: int = 0
    evidence: str = ""
    modules: dict = field(default_factory=dict)  # ordered sets
    phases: dict = field(default_factory=dict)
    phase_bytes: Counter = field(default_factory=Counter)


class PlacementRecorder:
    """Dispatch and function modes, module tracking and the memory readers around one device's run."""

    def __init__(self, model: torch.nn.Module, device: str):
        self.device = torch.device(device)
        if self.device.type not in READERS:
            raise PlacementDeviceError(f"device {device!r} has no memory reader — use one of {', '.join(READERS)}")
        self._read = READERS[self.device.type]
        self._modules = ModuleTracker(model)
        self._mapper = GradFnMapper(self._modules)
        self._phases = PhaseTracker(self._modules)
        self._tracker = track_step(model, (), ignore_device=None)
        self._phase = (OUTSIDE, 0)
        self._labels: list[tuple[str, str]] = []  # (request label, who asked) of the torch functions running
        self._transfers: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        self._fallbacks: dict[str, _Fallbacks] = defaultdict(_Fallbacks)
        self._memory: list[dict] = []
        self._devices: dict = {}
        self._misplaced: tuple[dict, ...] = ()
        self._caught: list = []
        self._seen = 0
        self._other: list = []  # warnings that are not fallbacks, emitted again at exit
        self._stack = contextlib.ExitStack()
        self.failed_in: tuple[str, int] | None = None  # (phase, iteration) an exception left first

    def __enter__(self) -> PlacementRecorder:
        stack = self._stack
        self._caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        stack.callback(torch.set_warn_always, torch.is_warn_always_enabled())
        torch.set_warn_always(True)
        for mode in (self._modules, StepFunctions((self._mapper,)), self._phases, self._tracker, Copies(self),
                     Requests(self)):
            stack.enter_context(mode)  # the requests mode last: it sees the caller's frame first
        return self

    def __exit__(self, *exc) -> None:
        self._drain()
        self._stack.close()
        seen = set()
        for w in self._other:
            key = (str(w.message), w.category, w.filename, w.lineno)
            if key not in seen:
                seen.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int):
        """Attribute what runs inside to `name` of `iteration`; read the memory counters when it ends.

        `step` (a target's own train_step) is split into forward, loss, backward and optimizer as it runs
        (trace.attribution.PhaseTracker); its memory is read once, at its end."""
        previous, self._phase = self._phase, (name, iteration)
        try:
            yield self
            self._drain()
        except BaseException:
            self.failed_in = self.failed_in or (self._phases.current() if name == WHOLE_STEP else name, iteration)
            raise
        finally:
            self._phase = previous
        self._memory.append({"iteration": iteration, "phase": name, "device": str(self.device),
                             **self._read(self._tracker)})

    def census(self, model, optimizer, inputs, loss) -> None:
        """Count parameters, buffers, inputs, loss and optimizer state per device (call after the first step).

        Parameters and optimizer state off the target device are `misplaced`, except 0-dim state on the CPU:
        PyTorch keeps AdamW's step counters on the host unless `capturable` or `fused`."""
        state = _optimizer_state(model, optimizer)
        self._devices = {"parameters": _count(model.parameters()), "buffers": _count(model.buffers()),
                         "inputs": _count(_leaves(inputs)), "loss": _count(_leaves(loss)),
                         "optimizer_state": _count(v for _, v in state),
                         "optimizer_scalars": _count(v for _, v in state if v.dim() == 0)}
        kept = [("parameter", n, p) for n, p in model.named_parameters()]
        kept += [("optimizer_state", n, v) for n, v in state if v.dim() > 0 or v.device.type != "cpu"]
        self._misplaced = tuple({"kind": kind, "name": n, "device": str(t.device), "bytes": _nbytes(t)}
                                for kind, n, t in kept if not _on(t.device, self.device))

    def result(self) -> Placement:
        """Everything recorded so far, as immutable data."""
        self._drain()
        transfers = tuple(Transfer(op, src, dst, b, module, phase, n)
                          for (op, src, dst, module, phase), (b, n) in self._transfers.items())
        fallbacks = tuple(FallbackUse(op, f.count, tuple(f.modules), tuple(f.phases), f.evidence, f.bytes,
                                      dict(f.phase_bytes))
                          for op, f in self._fallbacks.items())
        return Placement({k: dict(v) for k, v in self._devices.items()}, transfers, fallbacks,
                         tuple(self._memory), str(self.device), self._misplaced)

    # --- called by the modes ---------------------------------------------------------------------------

    def _where(self) -> tuple[str, str]:
        found = backward_module(self._mapper, self._modules)
        if found is not None:
            module = "" if found[1] == "none" else found[0] or ROOT
        else:
            current = self._modules.current
            module = "" if current is None else current or ROOT
        name = self._phase[0]
        return module, self._phases.current() if name == WHOLE_STEP else name

    def _record(self, op: str, source: str, destination: str, nbytes: int) -> None:
        entry = self._transfers[(op, source, destination, *self._where())]
        entry[0] += nbytes
        entry[1] += 1

    def _copied(self, func, args, out) -> None:
        """A dispatched copy: recorded when it crosses devices and opscan did not ask for it."""
        src, destination = copy_ends(func, args, out)
        if src.device == destination:
            return
        label, origin = self._labels[-1] if self._labels else (OpKey.of(func).display, "model")
        if origin == "opscan":
            return
        one = func.overloadpacket is _aten._local_scalar_dense
        self._record(label, str(src.device), str(destination), _nbytes(src, one=one))

    def _requested(self, label: str, x: torch.Tensor) -> None:
        """A host request of the model's code on a host tensor (it copies nothing): recorded on a CPU target."""
        if self.device.type == "cpu" and x.device.type == "cpu":
            self._record(label, str(x.device), "cpu", _nbytes(x, one=label in SYNC_READS))

    def _drain(self, func=None, args=(), out=None) -> None:
        """Attribute the warnings caught since the last drain: fallbacks to `func`, the module and the phase."""
        while self._seen < len(self._caught):
            w = self._caught[self._seen]
            self._seen += 1
            match = FALLBACK_WARNING.search(str(w.message))
            if match is None:
                self._other.append(w)
                continue
            entry = self._fallbacks[match.group("op")]
            module, phase = self._where()
            copied = sum(_nbytes(t) for t in (*tensors_in(args, {}), *tensors_in(out)) if t.device.type != "cpu")
            entry.count += 1
            entry.bytes += copied
            entry.phase_bytes[phase] += copied
            entry.modules.setdefault(module, None)
            entry.phases.setdefault(phase, None)
            entry.evidence = entry.evidence or _evidence(match.group(0), func)


def _evidence(text: str, func) -> str:
    dispatched = OpKey.of(func).display if func is not None else None
    where = f" (while dispatching {dispatched})" if dispatched and f"'{dispatched}'" not in text else ""
    return f"PyTorch warned: {text}{where}"


def _nbytes(t: torch.Tensor, one: bool = False) -> int:
    return t.element_size() * (1 if one else t.numel())


def _on(device: torch.device, target: torch.device) -> bool:
    return device.type == target.type and (target.index is None or device.index in (None, target.index))


def _optimizer_state(model, optimizer) -> list[tuple[str, torch.Tensor]]:
    """("<parameter name>.<key>", tensor) for every tensor in optimizer.state (step counters included)."""
    if optimizer is None:
        return []
    names = {id(p): n for n, p in model.named_parameters()}
    return [(f"{names.get(id(p), '<parameter>')}.{key}", v) for p, entries in optimizer.state.items()
            for key, v in entries.items() if isinstance(v, torch.Tensor)]


def _leaves(value) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _count(tensors) -> dict[str, int]:
    return dict(Counter(str(t.device) for t in tensors))
