"""API: what keeps `opscan.analyze` from changing the caller's objects.

The step is traced on deep copies (`copies_of`), made in one pass with one memo, so the copied optimizer's
parameter groups and state point at the copied model's parameters, and a loss module, a `train_step` bound to an
object, or inputs that share tensors with the model share them with the copy. The optimizer is copied the way torch
copies one (`Optimizer.__getstate__`: defaults, state and param groups; an LR scheduler's wrapper of the original's
`step` is not carried, nor are step hooks), plus any attribute of its own a subclass keeps.

StepCopies, not fake tensors: the trace then sees real values (`.item()`, masks, `nonzero`, the optimizer's step
counters) as the CLI's real-tensor trace does; the price is a second copy of the weights and the optimizer state
in memory while the scan runs.

A copy that is not one — a `__deepcopy__` that returns self, or a new module over the same parameter tensors —
is refused before anything runs (`check_apart`: no tensor of the copies is, or shares memory with, one of the
caller's), so the caller's weights are never stepped. What a copy cannot cover — a hook or closure that reaches the
caller's objects directly — is caught after the scan: `Fingerprint` records, cheaply, the identity and version
counter of every parameter, buffer, gradient and optimizer state tensor, the attributes of every module (and what
a dict, list or set attribute holds, a few levels down: a hook that writes into a dict the model holds) and the
optimizer's hyperparameters, and `changed()` names what differs. The global random states (torch's CPU generator
and CUDA's, Python's `random`, NumPy's when imported) are put back (`kept_random_state`).
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable

from opscan.errors import OpscanError, TargetError


class IsolationError(OpscanError):
    """The scan changed one of the caller's objects (a hook or closure reached it past the copies)."""


@dataclass(frozen=True)
class StepCopies:
    """The objects the step runs on: deep copies of the caller's."""

    model: Any
    inputs: Any
    optimizer: Any
    loss_fn: Callable | None
    train_step: Callable | None


def copies_of(model, inputs, optimizer=None, loss_fn=None, train_step=None) -> StepCopies:
    """Deep copies of the caller's objects, sharing one memo (see the module docstring)."""
    memo: dict[int, Any] = {}
    try:
        copied = [copy.deepcopy(obj, memo) for obj in (model, inputs, loss_fn, train_step)]
        opt = None if optimizer is None else copy_optimizer(optimizer, memo)
    except Exception as exc:  # noqa: BLE001 - any object that refuses to be copied is the caller's to fix
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TargetError(f"opscan.analyze traces copies of your objects and one cannot be copied: {type(exc).__name__}"
                          f": {first} — make it deep-copyable (copy.deepcopy), or scan a factory with the CLI "
                          "(opscan FILE.py:FUNCTION)") from None
    return StepCopies(copied[0], copied[1], opt, copied[2], copied[3])


def check_apart(model, optimizer, copies: StepCopies) -> None:
    """IsolationError, before anything runs, when a copy is the caller's object or holds the caller's tensors (a
    `__deepcopy__` that returns self): the step would change the caller's weights."""
    mine = _tensors_of(model, optimizer, "model")
    shared = [name for name, t in _tensors_of(copies.model, copies.optimizer, "copy").items()
              if any(t is m or _same_memory(t, m) for m in mine.values())]
    same = [label for label, a, b in (("the model", copies.model, model), ("the optimizer", copies.optimizer,
                                                                          optimizer)) if a is b and b is not None]
    if same or shared:
        what = ", ".join(same + [n.removeprefix("copy") or "(model)" for n in shared[:3]])
        more = f" and {len(shared) - 3} more" if len(shared) > 3 else ""
        raise IsolationError(
            f"copying your objects gave back your own: {what}{more} — a __deepcopy__ returns the object itself (or "
            "a copy over the same tensors), so the step would change your weights; nothing was run. Make "
            "copy.deepcopy give a real copy, or scan with the CLI (opscan FILE.py:FUNCTION)")


def _tensors_of(model, optimizer, root: str) -> dict:
    """{name: tensor} of the parameters, buffers and optimizer state of `model` and `optimizer`."""
    found = {f"{root}.{n}" if n else root: t for n, t in [*model.named_parameters(remove_duplicate=False),
                                                          *model.named_buffers(remove_duplicate=False)]}
    for i, state in enumerate(getattr(optimizer, "state", {}).values() if optimizer is not None else ()):
        found.update({f"{root} optimizer.state[{i}].{k}": v for k, v in state.items() if hasattr(v, "data_ptr")})
    return found


def _same_memory(a, b) -> bool:
    try:
        return a.numel() > 0 and b.numel() > 0 and a.device == b.device and a.data_ptr() != 0 and \
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):  # meta or fake tensors: no memory to share
        return False


def copy_optimizer(optimizer, memo: dict):
    """A deep copy of `optimizer` over the parameters already copied into `memo` (see the module docstring)."""
    clone = copy.deepcopy(optimizer, memo)
    for key, value in vars(optimizer).items():
        if key not in vars(clone) and not getattr(value, "_wrapped_by_lr_sched", False):
            setattr(clone, key, copy.deepcopy(value, memo))
    return clone


def optimizer_for(copies: StepCopies) -> Callable | None:
    """build_optimizer(model) for the target: the copied optimizer for the copied model; for another model (the
    memory stage's meta-device copies) a new optimizer of the same class and parameter groups over its parameters,
    matched by name. None without an optimizer (the step then builds AdamW, as the CLI does)."""
    if copies.optimizer is None:
        return None
    names = {id(p): n for n, p in copies.model.named_parameters()}

    def build(model):
        if model is copies.model:
            return copies.optimizer
        params = dict(model.named_parameters())
        groups = [{**g, "params": [params[names[id(p)]] for p in g["params"] if id(p) in names]}
                  for g in copies.optimizer.param_groups]
        return type(copies.optimizer)(groups)
    return build


class Fingerprint:
    """What `changed()` compares: cheap identities and version counters of the caller's objects."""

    def __init__(self, model, optimizer=None, extra: tuple = ()):
        self.model, self.optimizer, self.extra = model, optimizer, extra
        self.before = self._take()

    def changed(self) -> list[str]:
        """Names of what differs from when the fingerprint was taken (empty: nothing)."""
        after = self._take()
        return [name for name, value in self.before.items() if after.get(name, _GONE) != value] + \
            [name for name in after if name not in self.before]

    def _take(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for i, obj in enumerate((self.model, *self.extra)):
            if hasattr(obj, "named_modules"):
                found.update(_module_marks(obj, f"[{i}]" if i else "model"))
        if self.optimizer is not None:
            found.update(_optimizer_marks(self.optimizer))
        return found


_GONE = object()


def _tensor_mark(t) -> tuple:
    grad = getattr(t, "grad", None)
    return (id(t), t._version, t.data_ptr(), tuple(t.shape), id(grad), None if grad is None else grad._version)


def _module_marks(model, root: str) -> dict[str, Any]:
    marks: dict[str, Any] = {}
    for path, module in model.named_modules():
        where = f"{root}.{path}" if path else root
        marks[f"{where} attributes"] = {k: id(v) for k, v in vars(module).items()}
        marks.update({f"{where}.{k}": _contents(v) for k, v in vars(module).items()
                      if isinstance(v, (dict, list, set)) and not k.startswith("_")})
        for name, t in [*module._parameters.items(), *module._buffers.items()]:
            marks[f"{where}.{name}"] = None if t is None else _tensor_mark(t)
    return marks


def _contents(value, depth: int = 3, limit: int = 1000):
    """A mark of what a container holds (the identity of each item, a few levels down, at most `limit` items a
    level): a closure that writes into a dict the model holds changes it."""
    if depth == 0 or not isinstance(value, (dict, list, tuple, set)):
        return _tensor_mark(value) if hasattr(value, "_version") else id(value)
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value)) if not isinstance(
        value, set) else [(repr(v)[:80], v) for v in value]
    return (id(value), len(items), tuple((k if isinstance(k, (str, int)) else repr(k)[:80],
                                          _contents(v, depth - 1, limit)) for k, v in items[:limit]))


def _optimizer_marks(optimizer) -> dict[str, Any]:
    marks: dict[str, Any] = {"optimizer attributes": {k: id(v) for k, v in vars(optimizer).items()}}
    for i, group in enumerate(optimizer.param_groups):
        marks[f"optimizer.param_groups[{i}]"] = {k: (tuple(map(id, v)) if k == "params" else _plain(v))
                                                 for k, v in group.items()}
    for i, (param, state) in enumerate(optimizer.state.items()):
        marks[f"optimizer.state[{i}]"] = (id(param), {k: _plain(v) for k, v in state.items()})
    return marks


def _plain(value):
    """A comparable mark of a hyperparameter or a state entry (tensors: identity and version counter)."""
    if hasattr(value, "_version"):
        return _tensor_mark(value)
    return repr(value) if not isinstance(value, (int, float, str, bool, type(None))) else value


@contextlib.contextmanager
def kept_random_state():
    """Run the block and put torch's CPU generator (and CUDA's, once initialised), Python's `random` and NumPy's
    global state back after it."""
    import torch

    numpy = sys.modules.get("numpy")
    py_state = random.getstate()
    np_state = numpy.random.get_state() if numpy is not None else None
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []  # the trace seeds them too
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_state is not None:
                numpy.random.set_state(np_state)


def check_unchanged(fingerprint: Fingerprint) -> None:
    """IsolationError naming what the scan changed among the caller's objects, if anything."""
    changed = fingerprint.changed()
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise IsolationError(
            f"the scan changed your objects: {', '.join(changed[:3])}{more} — a hook, closure or global in the "
            "model, loss_fn or train_step reaches them directly instead of through its arguments; make it use its "
            "arguments, or scan with the CLI (opscan FILE.py:FUNCTION), which runs the step in a child process")
