"""Trace stage: name the torch.fx node behind each forward call, where symbolic tracing works.

The step always runs eagerly, so fx never changes what is recorded (symbolic_trace inlines
submodules and traces through activation checkpointing), and symbolic tracing never touches the user's
objects: every attribute it set on the model or on an object the model holds (a Proxy a scheduler
cached on itself) is put back, with the random state (untouched.py). When `torch.fx.symbolic_trace` succeeds,
each eager forward call is matched to its node: a leaf module's calls to its `call_module` node;
a torch function or tensor method called from module M to the next unused `call_function` /
`call_method` node of the same name whose innermost `nn_module_stack` entry is M. When tracing
fails (most Hugging Face models), the reason is kept in one line.
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch
import torch.fx
from opscan.trace.attribution import ModuleTracker
from opscan.trace.records import FxInfo
from opscan.trace.untouched import untouched


def symbolic(model: torch.nn.Module) -> tuple[torch.fx.Graph | None, FxInfo]:
    """Try symbolic_trace's tracer; return the graph or None, with what happened. Only the graph's nodes are read
    (their names, ops, targets and module stacks), so no GraphModule is built: its code generation and attribute
    copies cost a trace of resnet18 a few milliseconds and tell nothing (`torch.fx.GraphModule(model, graph)` makes
    one of it)."""
    try:
        with untouched(model):
            graph = _Tracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is just "no fx graph"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, FxInfo(False, f"{type(exc).__name__}: {first}"[:200])
    return graph, FxInfo(True, None, len(graph.nodes))


class _Tracer(torch.fx.Tracer):
    """symbolic_trace's tracer, finding a parameter's name in a dict: torch.fx scans `named_parameters()`
    for each parameter it meets, O(parameters) each, so 20,000 scalar parameters cost 2 x 10^8 steps."""

    _names: dict[int, str] | None = None

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        """The parameter's proxy, made once per name as torch.fx makes it; anything else as torch.fx does."""
        if not isinstance(attr_val, torch.nn.Parameter) or self.param_shapes_constant:
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if self._names is None:
            self._names = {}
            for name, p in self.root.named_parameters():  # the first name of each, as torch.fx's scan finds it
                self._names.setdefault(id(p), name)
        name = self._names.get(id(attr_val))
        if name is None:  # made during the forward: torch.fx's own search
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]


def _name(target) -> str:
    raw = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return raw.strip("_").removeprefix("i") if raw.startswith("__i") else raw.strip("_")


def _scope(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


class FxNodeTagger:
    """Sets `recorder.fx_node` while the eager call matching an fx node runs (a job of trace/functions.py's
    StepFunctions, acting on every call)."""

    funcs = None  # every call

    def __init__(self, graph: torch.fx.Graph, tracker: ModuleTracker, recorder):
        self.tracker, self.recorder = tracker, recorder
        self.functions: dict[tuple[str, str], deque[str]] = defaultdict(deque)
        self.leaves: dict[str, str] = {}
        for node in graph.nodes:
            if node.op == "call_module":
                self.leaves[node.target] = node.name
            elif node.op in ("call_function", "call_method"):
                self.functions[(_scope(node), _name(node.target))].append(node.name)
        self._handles: list = []
        self._saved: list[str | None] = []

    def enter(self) -> None:
        """Tag a leaf module's calls with its call_module node."""
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._enter_module),
                         hooks.register_module_forward_hook(self._leave_module, always_call=True)]

    def exit(self) -> None:
        """Remove the module hooks."""
        for handle in self._handles:
            handle.remove()

    def _enter_module(self, module, args) -> None:
        self._saved.append(self.recorder.fx_node)
        node = self.leaves.get(self.tracker.name_of(module))
        if node is not None and self.tracker.root_depth > 0:
            self.recorder.fx_node = node

    def _leave_module(self, module, args, output) -> None:
        self.recorder.fx_node = self._saved.pop() if self._saved else None

    def wrap(self, inner):
        """The chain link for every call: its fx node set while it runs (trace/functions.py)."""
        tracker, recorder, leaves, functions = self.tracker, self.recorder, self.leaves, self.functions
        names: dict = {}  # func -> _name(func), once per function

        def run(func, args, kwargs):
            stack = tracker.stack
            if not stack or tracker.root_depth == 0 or stack[-1] in leaves:
                return inner(func, args, kwargs)
            name = names.get(func)
            if name is None:
                name = names[func] = _name(func)
            queue = functions.get((stack[-1], name))
            if not queue:
                return inner(func, args, kwargs)
            previous, recorder.fx_node = recorder.fx_node, queue.popleft()
            try:
                return inner(func, args, kwargs)
            finally:
                recorder.fx_node = previous
        return run
