"""Trace stage: repeated layers traced once — the stack, the proof that its layers repeat, the short run.

A decoder stack (an `nn.ModuleList` or `nn.Sequential` of REPEAT_MIN or more children) whose layers are
exact repeats need not run every layer: the step runs on four of them — the first three and the last
(positions 0, 1, 2 and N-1) — and the calls of layers 3 .. N-2 are the calls of layer 2 replicated
(splice.py), in forward, backward and the optimizer's per-parameter work, with their module paths, storage
ids, autograd sequence numbers, lens groups, fx nodes and memory events renumbered as a full trace has them.

"Exact repeat" is proven, not assumed from the class:
- before the step (`find_stack`): every layer has the same class, the same submodule tree, parameters and
  buffers of the same dtype, shape, stride and requires_grad, the same plain attributes (an int that equals
  the layer's position plus a constant — `layer_idx` — is the only attribute allowed to differ), no hooks of
  its own, and the model's config names one layer type (`config.layer_types`);
- after the step (splice.py): layers 1 and 2 — each between two layers — recorded the same calls (op,
  dtypes, shapes, strides, arguments, module paths relative to the layer, storages relative to the layer,
  autograd structure, lens groups) and the same memory events, consumed as many autograd sequence numbers,
  and nothing outside the layers' own calls touched a middle layer's tensors (a foreach optimizer, gradient
  clipping over all parameters, a parent collecting every layer's output).
When a proof fails the step is traced in full, and the report's notes say why. Only steps on fake tensors
take the shortcut: there no value flows through the layers, so leaving layers out changes no later shape;
with real tensors the values of the skipped layers could.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

REPEAT_MIN = 5  # layers 0, 1, 2 and N-1 run; at least one layer is replicated
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
_SKIP = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_state_dict_hooks",
                   "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
                   "_forward_hooks_always_called", "_is_full_backward_hook", *_HOOKS})
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)


@dataclass(frozen=True)
class Stack:
    """A stack whose layers are proven alike before the step: its path and its layers in order."""

    path: str
    container: torch.nn.Module
    layers: tuple[torch.nn.Module, ...]

    @property
    def runs(self) -> tuple[int, ...]:
        """The positions that run: 0, 1, 2 and the last."""
        return (0, 1, 2, len(self.layers) - 1)

    def name(self, position: int) -> str:
        """The module path of the layer at `position`."""
        return f"{self.path}.{position}" if self.path else str(position)


@dataclass
class Marks:
    """What the short run saw at each running layer's forward: the call index, memory event count and autograd
    sequence number when it began (position 0..3 = layers 0, 1, 2, N-1; 4 = when the last one returned)."""

    calls: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    entered: int = 0
    index_reads: list[str] = field(default_factory=list)  # "layers.1.self_attn.layer_idx % ..." (_Watched)


def find_stack(model: torch.nn.Module) -> tuple[Stack | None, str | None]:
    """(the deepest-repeating stack proven alike before the step, or None; why a candidate was refused)."""
    refused = None
    candidates = [(path, m) for path, m in model.named_modules()
                  if type(m) in (torch.nn.ModuleList, torch.nn.Sequential) and len(m) >= REPEAT_MIN]
    for path, container in sorted(candidates, key=lambda pm: -len(pm[1])):
        layers = tuple(container)
        reason = _unlike(layers) or _config_mixed(model)
        if reason is None:
            return Stack(path, container, layers), None
        refused = refused or f"{path or 'the model'} ({len(layers)} x {type(layers[0]).__name__}): {reason}"
    return None, refused


def _unlike(layers) -> str | None:
    """Why the layers are not alike before the step, or None."""
    first = layers[0]
    if any(type(layer) is not type(first) for layer in layers):
        return "its layers are of different classes"
    shape = _shape(first)
    for position, layer in enumerate(layers):
        if _shape(layer) != shape:
            return f"layer {position}'s submodules, parameters or buffers differ from layer 0's"
        for (path, module), (_, base) in zip(layer.named_modules(), first.named_modules()):
            if any(getattr(module, h, None) for h in _HOOKS):
                return f"layer {position}{'.' + path if path else ''} has hooks of its own"
            reason = _attributes(module, base, position, path)
            if reason:
                return reason
    return None


def _shape(layer: torch.nn.Module) -> tuple:
    def meta(t):
        return None if t is None else (t.dtype, tuple(t.shape), t.stride(), t.requires_grad, type(t).__name__)
    return (tuple((p, type(m).__name__, m.training) for p, m in layer.named_modules()),
            tuple((n, meta(t)) for n, t in layer.named_parameters()),
            tuple((n, meta(t)) for n, t in layer.named_buffers()))


def _attributes(module, base, position: int, path: str) -> str | None:
    for name, value in vars(module).items():
        if name in _SKIP:
            continue
        other = vars(base).get(name, _MISSING)
        if value is other or _alike(value, other):
            continue
        if type(value) is int and type(other) is int and value - other == position:
            continue  # the layer's index (layer_idx), counted from layer 0's
        where = f"{path}." if path else ""
        return f"layer {position}'s attribute {where}{name} = {_short(value)} differs from layer 0's ({_short(other)})"
    return None


_MISSING = object()


def _alike(a, b) -> bool:
    """Equal plain values (numbers, strings, dtypes, devices), tuples, lists and dicts of alike values, or modules
    held outside the module tree (not submodules: a dict of per-layer function wrappers, transformers 5.25's
    `_kernel_funcs`) that are alike as layers are: one class, one shape, alike attributes, no hooks."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, torch.nn.Module):
        return _unlike((b, a)) is None
    return type(a) in _PLAIN and a == b


def _short(value) -> str:
    text = "missing" if value is _MISSING else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _config_mixed(model) -> str | None:
    types = getattr(getattr(model, "config", None), "layer_types", None)
    if isinstance(types, (list, tuple)) and len(set(map(str, types))) > 1:
        return f"config.layer_types mixes {', '.join(sorted(set(map(str, types))))}"
    return None


@contextlib.contextmanager
def short_run(stack: Stack, marks: Marks, clock, events, seq):
    """Run the step on layers 0, 1, 2 and N-1 only (the container holds just them), marking where each began:
    `clock()` the next call index, `events()` the memory events so far, `seq()` the autograd sequence number."""
    running = {id(stack.layers[p]): k for k, p in enumerate(stack.runs)}
    last = stack.layers[-1]

    def pre(module, args):
        k = running.get(id(module))
        if k is not None:
            marks.entered += 1
            marks.calls.append(clock())
            marks.events.append(events())
            marks.seqs.append(seq())

    def post(module, args, output):
        if module is last and len(marks.calls) == 4:  # the stack's end: one more mark
            marks.calls.append(clock())
            marks.events.append(events())
            marks.seqs.append(seq())

    saved = stack.container._modules
    kept = [stack.layers[p] for p in stack.runs]
    watched = _watch(stack, marks.index_reads)
    vars(stack.container)["_modules"] = type(saved)((str(k), layer) for k, layer in enumerate(kept))
    hooks = torch.nn.modules.module
    handles = [hooks.register_module_forward_pre_hook(pre), hooks.register_module_forward_hook(post, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        vars(stack.container)["_modules"] = saved
        for module, name, value in watched:
            vars(module)[name] = value


def _watch(stack: Stack, reads: list[str]) -> list[tuple]:
    """Put a _Watched int in place of every index attribute (an int that differs by the layer's position) of the
    running layers; returns what to put back."""
    first = stack.layers[0]
    base = {(path, name) for path, module in first.named_modules() for name, value in vars(module).items()
            if type(value) is int}
    other = stack.layers[1]
    put_back = []
    for path, name in sorted(base):
        if vars(other.get_submodule(path)).get(name) == vars(first.get_submodule(path))[name]:
            continue  # the same in every layer (find_stack proved it): not an index
        for q in stack.runs:
            module = stack.layers[q].get_submodule(path)
            value = vars(module)[name]
            put_back.append((module, name, value))
            vars(module)[name] = _Watched(value, f"{stack.name(q)}{'.' + path if path else ''}.{name}", reads)
    return put_back


class _Watched(int):
    """An index attribute that notes being read in arithmetic, a comparison, a truth test or a hash (a dict or
    set lookup): a layer that branches on its index. Indexing a list with it (a per-layer cache entry) is not
    noted: list indexing takes an int subclass's value without calling it."""

    def __new__(cls, value: int, where: str, reads: list):
        self = super().__new__(cls, value)
        self.where, self.reads = where, reads
        return self


def _noting(name: str):
    method = getattr(int, name)

    def noted(self, *args):
        self.reads.append(f"{self.where} ({name.strip('_')})")
        return method(int(self), *(int(a) if isinstance(a, _Watched) else a for a in args))
    return noted


for _name in ("__mod__", "__rmod__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__",
              "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__", "__rfloordiv__",
              "__truediv__", "__and__", "__or__", "__xor__", "__bool__", "__hash__", "__pow__", "__divmod__"):
    setattr(_Watched, _name, _noting(_name))


def sequence_nr() -> int:
    """The autograd sequence number the next node will take."""
    return int(torch._C._autograd._get_sequence_nr())


class Retrace(Exception):
    """The short run did not prove its layers repeat: trace every layer; `note` says why."""

    def __init__(self, note: str):
        super().__init__(note)
        self.note = note
