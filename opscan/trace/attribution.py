"""Trace stage: which module and phase caused each call.

Forward: global module hooks keep a stack of module paths. Backward: every autograd node created in
forward is mapped, by its sequence number, to the module whose code created it (a job of the trace's
TorchFunctionMode, trace/functions.py, walks the new part of the autograd graph after each torch function, and
module hooks claim what that mode cannot see: autograd.Function nodes, a reentrant checkpoint's recompute), and the
engine's current node names it during backward. Gradient accumulation is attributed to the
parameter's module; optimizer calls to the module owning the parameters they touch.
"""

from __future__ import annotations

import torch
from torch.optim import optimizer as optim_hooks


_ACCUMULATE = "AccumulateGrad"
_NO_TENSORS = frozenset({bool, int, float, str, type(None), torch.Size, torch.dtype, torch.device})

# opscan's own reads of tensor attributes (`grad_fn`, `grad`, `untyped_storage()`) in hooks that run outside the trace's
# TorchFunctionMode (module and optimizer hooks): with torch functions off, each is a C getter, not a call through the
# mode's chain of jobs (the C getter is what the mode, and a subclass's default __torch_function__, would run)
_OWN_READS = torch._C.DisableTorchFunction

class ModuleTracker:
    """Names modules by their path in the model and tracks which ones are running."""

    def __init__(self, model: torch.nn.Module):
        self.root = model
        self.names: dict[int, str] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self.names.setdefault(id(module), path)
        self.param_owner: dict[int, str] = {}
        for path, module in model.named_modules():
            for param in module.parameters(recurse=False):
                self.param_owner.setdefault(id(param), path)
        self.stack: list[str] = []
        self.root_depth = 0
        self._handles: list = []

    def name_of(self, module: torch.nn.Module) -> str:
        """Dotted path in the model, or `<ClassName>` for modules outside it (a loss module)."""
        return self.names.get(id(module), f"<{type(module).__name__}>")

    def _running_name(self, module: torch.nn.Module) -> str:
        """The path a running module's calls are attributed to: its own, or — for a module outside the model's
        tree called from inside a model module (one held in a plain dict or list, not registered: transformers
        5.25's per-layer `_kernel_funcs` wrappers) — the model module that called it, as its calls are that
        module's code; a module outside the tree called from outside the model (a loss) keeps `<ClassName>`."""
        name = self.names.get(id(module))
        if name is not None:
            return name
        caller = self.stack[-1] if self.stack else None
        return caller if caller is not None and not caller.startswith("<") else f"<{type(module).__name__}>"

    def _pre(self, module, args):
        self.stack.append(self._running_name(module))
        if module is self.root:
            self.root_depth += 1

    def _post(self, module, args, output):
        if self.stack:
            self.stack.pop()
        if module is self.root:
            self.root_depth -= 1

    def __enter__(self) -> ModuleTracker:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._pre),
            hooks.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    @property
    def current(self) -> str | None:
        """Innermost running module path, or None outside every module."""
        return self.stack[-1] if self.stack else None


class GradFnMapper:
    """After each torch function, maps the autograd nodes it created to the running module (a job of
    trace/functions.py's StepFunctions, acting on every call)."""

    funcs = None  # every call

    def __init__(self, tracker: ModuleTracker):
        self.tracker = tracker
        self.node_module: dict[int, str] = {}
        self._handles: list = []

    def enter(self) -> None:
        """Claim at module boundaries what the mode cannot see.

        Nodes the mode cannot see being made (autograd.Function.apply, and anything run inside
        the autograd engine, where torch-function modes are off: a reentrant checkpoint's
        recompute) are claimed at module boundaries instead: a module's inputs by its caller,
        its output by the module itself. Registered after ModuleTracker's hooks, so in
        `_entering` the module is already on top of the stack."""
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._entering),
            hooks.register_module_forward_hook(self._leaving, always_call=True),
        ]

    def exit(self) -> None:
        """Remove the module hooks."""
        for handle in self._handles:
            handle.remove()

    def _entering(self, module, args) -> None:
        stack = self.tracker.stack
        with _OWN_READS():
            self._claim(args, stack[-2] if len(stack) > 1 else "")

    def _leaving(self, module, args, output) -> None:
        with _OWN_READS():
            self._claim(output, self.tracker.name_of(module))

    def wrap(self, inner):
        """The chain link for every call: claim the nodes its output brought (trace/functions.py)."""
        claim, stack, grad_enabled = self._claim, self.tracker.stack, torch.is_grad_enabled

        def run(func, args, kwargs):
            out = inner(func, args, kwargs)
            if type(out) in _NO_TENSORS or not grad_enabled():
                return out  # (shape queries, sizes, flags: most calls)
            claim(out, stack[-1] if stack else "")  # (the tracker's current module)
            return out
        return run

    def _claim(self, out, module: str) -> None:
        if isinstance(out, torch.Tensor):  # the common case, without the generator below
            node = out.grad_fn
            if node is None or node._sequence_nr() in self.node_module:
                return
            todo = [node]
        else:
            todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or type(node).__name__ == _ACCUMULATE:
                continue
            seq = node._sequence_nr()
            if seq in self.node_module:
                continue
            self.node_module[seq] = module
            todo.extend(fn for fn, _ in node.next_functions)


_UNREAD = object()  # backward_module's node, not read by its caller


def backward_module(mapper: GradFnMapper, tracker: ModuleTracker, node=_UNREAD) -> tuple[str, str] | None:
    """(module path, how it was found) for a call made by the autograd engine, else None (`node`: the autograd node
    running now, when the caller has read it)."""
    if node is _UNREAD:
        node = torch._C._current_autograd_node()
    if node is None:
        return None
    if type(node).__name__ == _ACCUMULATE:
        owner = tracker.param_owner.get(id(node.variable))
        return (owner, "parameter") if owner is not None else ("", "none")
    module = mapper.node_module.get(node._sequence_nr())
    return (module, "autograd") if module is not None else ("", "none")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


class PhaseTracker:
    """forward (inside the model), loss (after forward, before backward), backward (autograd engine),
    optimizer (inside optimizer.step, and any glue after backward: clipping, unscaling)."""

    def __init__(self, tracker: ModuleTracker):
        self.tracker = tracker
        self.in_optimizer = 0
        self.after_backward = False
        self._handles: list = []

    def current(self) -> str:
        """The phase of a call made now."""
        return self.at(torch._C._current_autograd_node())

    def at(self, node) -> str:
        """The phase of a call made now, while autograd node `node` runs (None: outside the engine)."""
        if node is not None:
            self.after_backward = True
            return "backward"
        if self.tracker.root_depth > 0:
            self.after_backward = False
            return "forward"
        if self.in_optimizer or self.after_backward:
            return "optimizer"
        return "loss"

    def _pre(self, *_):
        self.in_optimizer += 1

    def _post(self, *_):
        self.in_optimizer -= 1

    def __enter__(self) -> PhaseTracker:
        self._handles = [
            optim_hooks.register_optimizer_step_pre_hook(self._pre),
            optim_hooks.register_optimizer_step_post_hook(self._post),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()


__all__ = ["ModuleTracker", "GradFnMapper", "PhaseTracker", "backward_module"]
