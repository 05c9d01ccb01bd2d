"""Trace stage: tensors that stay on the host while a Mac runs the step on MPS, seen where the CPU trace cannot
tell them apart, and named at the line that made them (the placement model: trace/tensors.py StoragePlaces).

At the dispatcher `torch.linspace(0, 1, 5)` and `torch.linspace(0, 1, 5, device=x.device)` are the same call
in a CPU trace, but on a Mac only the second lands on MPS. Two jobs of the trace's one TorchFunctionMode
(trace/functions.py) see the Python calls:

- `HostFactories`: a factory called without `device=` (or with the string "cpu"), under a CPU default device,
  makes a tensor that stays on the CPU: its storage is a host source, named by the factory and the line that
  called it; with a `device=`, what it makes is on the device (`torch.tensor(data, device=d)` included, whose
  data tensor the dispatcher first meets when it is lifted), except from a NumPy array, which PyTorch wraps on the
  CPU and then moves (`.to(d, dtype)`, converting on the CPU): the wrap is a host call and the move a copy.
  That lets a condition see a CPU tensor meet an MPS
  tensor in one call (a scheduler's `sigmas[i]` multiplying an MPS latent), and a verdict see an MPS kernel
  handed a CPU tensor.
- `HostDevices`: a device read from a host tensor (`device=coords.device`) names the host, not the step's device.
- `DeviceMoves`: the user's own `.to(device)` (any device but the string "cpu"; a tensor argument: that
  tensor's place) or `.cuda()` of a host tensor lands it on the device, as on a Mac, where `device` is MPS.
  In a CPU trace such a call dispatches nothing (the tensor already is a CPU tensor), so the job dispatches the
  copy MPS runs (`aten::_to_copy`) and the caller gets it: what is made from it afterwards is on the device.

- `CompositeMoves`: a C++ composite that moves a CPU argument to the device itself (`F.ctc_loss`'s targets:
  COMPOSITE_MOVES, each with its source) does it invisibly in a CPU trace; the job makes that copy before the call.
  A scalar `Tensor.__setitem__` writes (`x[..., 0] = 3`) is made on x's device by PyTorch, outside the dispatcher.

`name_before_step(model, target)` names the tensors that existed before the step without being given, for the
storages the trace will meet: a plain tensor attribute of a module (`Net.mask`, at its `self.mask = ...`), a
module-level tensor (`TARGETS`, at its assignment) or one a function of the step closes over.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import linecache

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from opscan.trace.guard import call_through
from opscan.trace.records import CallSite

_FACTORIES = frozenset(f for f in (
    torch.tensor, torch.as_tensor, torch.linspace, torch.logspace, torch.arange, torch.zeros, torch.ones,
    torch.full, torch.empty, torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye,
    torch.scalar_tensor) if f is not None)
_MOVES = frozenset(f for f in (torch.Tensor.to, torch.Tensor.cuda, getattr(torch.Tensor, "mps", None))
                   if f is not None)


class HostFactories:
    """Makes what a Python factory called without `device=` returns a host source (module docstring)."""

    funcs = _FACTORIES

    def __init__(self, storages):
        self.storages = storages  # the recorder's StorageIds (its StoragePlaces)

    def wrap(self, inner):
        """The chain link for the factories (trace/functions.py)."""
        def run(func, args, kwargs):
            placement = self.storages.placement
            device = kwargs.get("device")
            if not placement.tracking or placement.factory is not None:
                return inner(func, args, kwargs)
            on_host = device == "cpu" or placement.names_host(device)  # `device=coords.device`, coords a host tensor
            if device is not None and not on_host and args and _is_array(args[0]):
                return self._from_array(func, args, kwargs, inner)
            if not on_host and (device is not None or not _default_is_cpu()):  # made on the device
                placement.moving += 1
                try:
                    return inner(func, args, kwargs)
                finally:
                    placement.moving -= 1
            placement.factory = f"torch.{func.__name__}"
            try:
                out = inner(func, args, kwargs)  # the user's call: its errors are theirs
                if isinstance(out, torch.Tensor):
                    sid = self.storages.of(out)
                    if sid not in placement.host and sid not in placement.given:  # dispatched nothing we saw
                        placement.mark_host(sid, placement.factory_source())
            finally:
                placement.end_factory()
            return out
        return run


    def _from_array(self, func, args, kwargs, inner):
        """`torch.tensor(array, dtype=..., device=d)`: PyTorch wraps a NumPy array on the CPU and then moves it with
        `.to(d, dtype)`, which converts on the CPU first (Copy.mm copy_to_mps_): the wrap and the cast are host
        calls (a float64 array never exists on MPS) and the move is the copy a Mac makes."""
        placement = self.storages.placement
        placement.factory = f"torch.{func.__name__}"
        try:
            out = inner(func, args, kwargs)
        finally:
            placement.end_factory()
        return _landed(placement, out) if isinstance(out, torch.Tensor) else out


class DeviceMoves:
    """Lands what the user's own `.to(device)` of a host tensor returns on the device (module docstring)."""

    funcs = _MOVES

    def __init__(self, storages):
        self.storages = storages

    def wrap(self, inner):
        """The chain link for `.to`, `.cuda` and `.mps` (trace/functions.py)."""
        def run(func, args, kwargs):
            x = args[0] if args else None
            placement = self.storages.placement
            if not isinstance(x, torch.Tensor) or not placement.tracking or x.device.type == "meta" \
                    or not self._moves(func, x, args, kwargs):
                return inner(func, args, kwargs)
            placement.read(self.storages.of(x))  # a tensor first met here stays a host source (the copy is not)
            placement.moving += 1
            try:
                out = inner(func, args, kwargs)
                if out is x:  # a CPU trace's no-op: dispatch the copy a Mac makes
                    out = _copy(x)
            finally:
                placement.moving -= 1
            return out
        return run

    def _moves(self, func, x: torch.Tensor, args, kwargs) -> bool:
        """True for a call that puts a host tensor on the step's device."""
        placement = self.storages.placement
        if not placement.is_host(self.storages.of(x)):
            return False
        if func is not torch.Tensor.to:
            return True  # .cuda(), .mps()
        target = kwargs.get("device", kwargs.get("other", args[1] if len(args) > 1 else None))
        if isinstance(target, torch.Tensor):
            return not placement.is_host(self.storages.of(target))
        if isinstance(target, str):
            return target.split(":")[0] != "cpu"  # the string "cpu" is a host move (trace/moves.py)
        # a device variable: MPS on a Mac, unless it was read from a host tensor; a dtype alone moves nothing
        return isinstance(target, torch.device) and not placement.names_host(target)


class HostDevices:
    """Remembers the device objects read from host tensors (`coords.device`, coords on the CPU on a Mac): in a CPU
    trace every `.device` is the CPU, but a factory given such a device makes its tensor on the host, and a
    `.to()` to it moves nothing, as on a Mac (timm's DINOv3 RoPE builds its coordinates that way on purpose)."""

    funcs = frozenset({torch.Tensor.device.__get__})

    def __init__(self, storages):
        self.storages = storages
        self._fake_device = None  # FakeTensor's own `device` property while the trace replaces it

    def wrap(self, inner):
        """The chain link for the `Tensor.device` getter (trace/functions.py)."""
        def run(func, args, kwargs):
            out = inner(func, args, kwargs)
            if args and isinstance(args[0], torch.Tensor):
                self._note(args[0], out)
            return out
        return run

    def enter(self):
        """A FakeTensor's `device` is a Python property that no TorchFunctionMode sees (and one shared object per
        device): while the step runs it hands out a fresh object per read, noted like the getter's."""
        original = next((k.__dict__["device"] for k in FakeTensor.__mro__ if "device" in k.__dict__), None)
        if not isinstance(original, property):  # a release that spells it otherwise: the getter job alone
            return
        self._fake_device = original

        def device(tensor):
            found = original.fget(tensor)
            if found.type == "meta":
                return found
            fresh = torch.device(found)
            self._note(tensor, fresh)
            return fresh
        FakeTensor.device = property(device)

    def exit(self):
        if self._fake_device is not None:
            FakeTensor.device, self._fake_device = self._fake_device, None

    def _note(self, tensor, device) -> None:
        placement = self.storages.placement
        if not placement.tracking or device.type == "meta":
            return
        sid = self.storages.known(tensor)  # a storage not met yet existed before the step without being given
        if sid is None or placement.is_host(sid):
            placement.host_devices[id(device)] = device  # kept alive: its id names it for the step


# C++ composites that move a CPU argument to another argument's device themselves — a `.to()` that dispatches nothing in
# a CPU trace: (the Python functions, their leading argument names, the argument whose device it is, the moved ones,
# the source)
COMPOSITE_MOVES = (
    ((torch.nn.functional.ctc_loss, torch.ctc_loss), ("log_probs", "targets", "input_lengths", "target_lengths"),
     "log_probs", ("targets", "target_lengths"),
     "aten/src/ATen/native/LossCTC.cpp ctc_loss_impl: `targets.to(log_probs.device(), kLong)` ('if the targets are on "
     "CPU ... let's move them to GPU as a service for the user'); ctc_loss's fast path for plain tensors reads the "
     "lengths on the CPU and makes the mean's divisor with `at::tensor(target_lengths, res.options())`, on the "
     "device [src]"),
)


class CompositeMoves:
    """Moves what a C++ composite moves itself (COMPOSITE_MOVES) before the call, as the copy a Mac makes, and
    `Tensor.__setitem__`'s scalar value, which PyTorch makes on the indexed tensor's device (a CPU tensor here,
    made outside the dispatcher: TensorIndexing.h scalarToTensor)."""

    funcs = frozenset({torch.Tensor.__setitem__, *(f for entry in COMPOSITE_MOVES for f in entry[0])})

    def __init__(self, storages):
        self.storages = storages
        self._entries = {f: entry for entry in COMPOSITE_MOVES for f in entry[0]}

    def wrap(self, inner):
        """The chain link for the composites of COMPOSITE_MOVES and `__setitem__` (trace/functions.py)."""
        def run(func, args, kwargs):
            placement = self.storages.placement
            if not placement.tracking or not args or not isinstance(args[0], torch.Tensor):
                return inner(func, args, kwargs)
            if func is torch.Tensor.__setitem__:
                return self._on_device(args[0], inner, func, args, kwargs)
            _, names, to, moved, _ = self._entries[func]
            bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
            if not isinstance(bound.get(to), torch.Tensor) or placement.is_host(self.storages.of(bound[to])):
                return inner(func, args, kwargs)
            args, kwargs = list(args), dict(kwargs)
            for name in moved:
                t = bound.get(name)
                if isinstance(t, torch.Tensor) and placement.is_host(self.storages.of(t)):
                    placement.read(self.storages.of(t))
                    copy = _landed(placement, t)
                    if name in kwargs:
                        kwargs[name] = copy
                    else:
                        args[names.index(name)] = copy
            return inner(func, tuple(args), kwargs)
        return run

    def _on_device(self, x, inner, func, args, kwargs):
        placement = self.storages.placement
        if placement.is_host(self.storages.of(x)):
            return inner(func, args, kwargs)
        placement.moving += 1  # the scalar value it makes, first met inside: on x's device
        try:
            return inner(func, args, kwargs)
        finally:
            placement.moving -= 1


def _landed(placement, x: torch.Tensor) -> torch.Tensor:
    """The copy a Mac makes of host tensor `x` on the device: what it makes lands there (`moving`)."""
    placement.moving += 1
    try:
        return _copy(x)
    finally:
        placement.moving -= 1


def _copy(x: torch.Tensor) -> torch.Tensor:
    """The copy a Mac makes of a host tensor it moves to the device (a real tensor's, for real)."""
    with contextlib.nullcontext() if isinstance(x, FakeTensor) else unset_fake_temporarily():
        return call_through(torch.ops.aten._to_copy.default, x)


def _is_array(data) -> bool:
    """A NumPy array (checked by its type's module: NumPy is not imported for this)."""
    return type(data).__module__ == "numpy" and type(data).__name__ == "ndarray"


def _default_is_cpu() -> bool:
    get = getattr(torch, "get_default_device", None)  # torch 2.3+
    return get is None or get().type in ("cpu", "meta")


def name_before_step(model: torch.nn.Module, functions=()) -> list[tuple[torch.Tensor, tuple]]:
    """(tensor, (kind, name, CallSite of its assignment or None)) for the tensors that existed before the step
    and may reach it without being given: plain tensor attributes of the model's modules, module-level tensors
    and closed-over tensors of `functions` (the target's hooks) and of the modules' `forward`."""
    found: list[tuple[torch.Tensor, tuple]] = []
    classes: dict[type, None] = {}
    for path, module in model.named_modules():
        classes.setdefault(type(module))
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                found.append((value, ("attribute", f"{type(module).__name__}.{attr}",
                                      _assignment(type(module), attr))))
    for fn in (*functions, *(getattr(c, "forward", None) for c in classes)):
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        scope = getattr(fn, "__globals__", {})
        for name in set(code.co_names) & scope.keys():  # the globals it uses
            if isinstance(scope[name], torch.Tensor):
                found.append((scope[name], ("global", name, _global_line(code.co_filename, name))))
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            value = _cell(cell)
            if isinstance(value, torch.Tensor):
                found.append((value, ("closure", name, _site(code.co_filename, code.co_firstlineno,
                                                             fn.__qualname__))))
    return found


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _site(file: str, line: int | None, function: str) -> CallSite | None:
    return CallSite(file, line, function) if file and line else None


def _assignment(cls: type, attr: str) -> CallSite | None:
    """Where `self.<attr> = ...` is in the class's source (the first one), or None."""
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:
        return None
    tree = _tree(file) if file else None
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Assign, ast.AnnAssign)) and any(
                        isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                        and t.value.id == "self" for t in _targets(sub)):
                    return CallSite(file, sub.lineno, _function_at(node, sub.lineno))
    return None


def _global_line(file: str, name: str) -> CallSite | None:
    """Where the module-level `<name> = ...` of a file is, or None."""
    tree = _tree(file)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == name for t in _targets(node)):
            return CallSite(file, node.lineno, "<module>")
    return None


def _targets(node) -> list:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = []
    for t in targets:
        out.extend(t.elts if isinstance(t, ast.Tuple) else [t])
    return out


def _function_at(cls: ast.ClassDef, line: int) -> str:
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.lineno <= line <= (
                item.end_lineno or item.lineno):
            return f"{cls.name}.{item.name}"
    return cls.name


@functools.lru_cache(maxsize=64)
def _tree(file: str):
    text = "".join(linecache.getlines(file))
    try:
        return ast.parse(text) if text else None
    except SyntaxError:
        return None
