"""Trace stage: see ops the way MPS dispatches them, at the dispatcher, however deep the call sits.

A CPU trace sees decompositions: `linear` becomes `t` + `addmm`, attention becomes the CPU flash
kernel. On MPS some composites have their own kernel, and some branch on device. The lens catches
those composites before they decompose, using a small rewrite table whose every row carries its
condition and its source, and whose kernel must exist in the release's yaml:
- "replace" rows mark the span of CPU calls (and the autograd nodes they create) that MPS runs as
  one op and one backward op;
- "steer" rows run the branch MPS takes instead of the CPU one (attention takes the math path on
  MPS unless its own kernel applies), so the recorder sees MPS's own op list.
Besides its rows, the lens records "span" groups for the span ops it is given (`spans`: composites whose C++
kernel differs between releases, composite_callees.txt): the calls one such call dispatched, so the predict stage
can judge them by another release's kernel (predict/release_paths.py). The same for every release.

Where it looks: every row is a CompositeImplicitAutograd aten op, and the lens is a kernel for that
op at the autograd keys (AutogradCPU, AutogradMeta; hooks.py), where a CIA op is decomposed. So it
sees the call wherever it comes from: user code, a torch function calling another inside its body
(`F.multi_head_attention_forward` -> `scaled_dot_product_attention`, where a TorchFunctionMode is
switched off), C++ (`gru`'s cells call `at::linear`), or the autograd engine (a checkpoint's
recompute). Under `torch.inference_mode` the autograd keys are skipped: the recorder (or, in a
sizing run, the CPU backend key) hands the op to the lens instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from opscan.opkey import OpKey
from opscan.trace.argspec import encode
from opscan.trace.guard import call_through
from opscan.trace.functions import StepFunctions
from opscan.trace.hooks import activate, deactivate
from opscan.trace.questions import Questions
from opscan.trace.records import Group

SRC_YAML = "native_functions.yaml: CompositeImplicitAutograd and MPS entries; derivatives.yaml backward"
SRC_RMS = "aten/src/ATen/native/layer_norm.cpp rms_norm_symint (main-branch copy; mps_facts.md §8 [INF])"
SRC_SDPA = ("aten/src/ATen/native/transformers/attention.cpp scaled_dot_product_attention: choice_int starts at "
            "SDPBackend::math and only devices with a _fused_sdp_choice_stub entry (never MPS; 2.0-2.1: CUDA only) "
            "choose another backend, so MPS runs the math path in every 2.x release unless its own kernel applies "
            "(2.5+; main-branch copy, mps_facts.md §8)")
SRC_LSTM = "mps_facts.md §8: at::native::lstm calls _lstm_mps for MPS input [bin]"
SPAN_RULE = "composite-span"
SPAN_CONDITION = ("a CompositeImplicitAutograd op whose C++ kernel calls other ops in some covered release: the calls "
                  "it dispatched, kept as a span")
SPAN_SOURCE = "opscan/knowledge/composite_callees.txt (tools/build_composite_callees.py) [bin]"


@dataclass(frozen=True)
class Branch:
    """One row of the rewrite table: the aten composite it intercepts and how MPS runs it."""

    rule: str
    op: str  # the CompositeImplicitAutograd overload (aten), e.g. "linear", "lstm.input"
    kernel: OpKey  # the op whose MPS kernel must exist in the release for a "replace" decision
    decide: Callable  # (args, kwargs, grad_needed, macos_at_least, has_kernel) -> ("replace", fwd, bwd)
    # | ("steer", fn) | None; macos_at_least(version) and has_kernel() ask the release (questions.py), so a row asks
    # only what its decision turns on, and a trace records only the answers it depended on
    condition: str
    source: str


def _linear(args, kwargs, grad, macos_at_least, has_kernel):
    return ("replace", OpKey("aten", "linear"), OpKey("aten", "linear_backward")) if has_kernel() else None


def _max_pool2d(args, kwargs, grad, macos_at_least, has_kernel):
    # aten::max_pool2d never returns indices (F.max_pool2d(return_indices=True) calls max_pool2d_with_indices)
    return ("replace", OpKey("aten", "max_pool2d"), OpKey("aten", "max_pool2d_backward")) if has_kernel() else None


def _rms_norm(args, kwargs, grad, macos_at_least, has_kernel):
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    if weight is None or grad or not has_kernel():
        return None  # MPS runs rms_norm_composite: the same decomposition the CPU trace shows
    return "replace", OpKey("aten", "_fused_rms_norm"), None


def _sdpa(args, kwargs, grad, macos_at_least, has_kernel):
    q, k, v = args[:3]
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    contiguous = all(t.is_contiguous() for t in (q, k, v))
    if dropout == 0.0 and not grad and has_kernel() and (contiguous or macos_at_least((15, 0))):
        return "replace", OpKey("aten", "_scaled_dot_product_attention_math_for_mps"), None
    return "steer", _sdpa_math


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]


def _lstm(args, kwargs, grad, macos_at_least, has_kernel):
    return ("replace", OpKey("aten", "_lstm_mps"), OpKey("aten", "lstm_mps_backward")) if has_kernel() else None


BRANCHES = (
    Branch("mps-linear", "linear", OpKey("aten", "linear"), _linear,
           "always on MPS: linear has its own MPS kernel above its decomposition", SRC_YAML),
    Branch("mps-max-pool2d", "max_pool2d", OpKey("aten", "max_pool2d"), _max_pool2d,
           "aten::max_pool2d (F.max_pool2d with return_indices=False)", SRC_YAML),
    Branch("mps-fused-rms-norm", "rms_norm", OpKey("aten", "_fused_rms_norm"), _rms_norm,
           "weight given and no grad needed (else MPS runs the composite, as the CPU trace does)", SRC_RMS),
    Branch("mps-sdpa", "scaled_dot_product_attention", OpKey("aten", "_scaled_dot_product_attention_math_for_mps"),
           _sdpa,
           "dropout_p == 0, no grad needed, contiguous q/k/v or macOS >= 15, and a release with the kernel (2.5+) "
           "→ the MPS kernel; otherwise the math path (_scaled_dot_product_attention_math), never the CPU flash "
           "kernel", SRC_SDPA),
    Branch("mps-lstm", "lstm.input", OpKey("aten", "_lstm_mps"), _lstm,
           "nn.LSTM on padded input (aten::lstm.input; packed input is lstm.data, left as traced): "
           "_lstm_mps forward, lstm_mps_backward", SRC_LSTM),
)


class Lens:
    """Marks (or steers) the calls MPS dispatches differently; see the module docstring.

    `release` (questions.py): the predicted-for release, asked whether it gives a row's op an MPS kernel and
    whether the assumed macOS is recent enough, only when a decision turns on it (None: no rows, the plain CPU
    trace); `clock()` is the index of the next recorded call (a group spans [clock before, clock after));
    `tracker` (the trace's ModuleTracker) names the group's module; `paused()` is True while the recorder
    re-runs a composite to record its callees (the lens leaves those calls as they are); `gate`: the
    TorchFunctionMode that keeps the inference fast paths off while the lens is on (trace/functions.py), entered
    with it (None: a pass-through StepFunctions of its own; the trace passes a null context, its one mode being
    on already)."""

    def __init__(self, release: Questions | None, clock: Callable[[], int] | None = None, tracker=None,
                 paused: Callable[[], bool] | None = None, spans: frozenset[str] = frozenset(), gate=None):
        self.release, self.clock, self.tracker = release, clock, tracker
        self.paused = paused or (lambda: False)
        self.spans = spans
        self.table = {b.op: b for b in BRANCHES} if release is not None and release.kernel_of is not None else {}
        self.groups: list[Group] = []
        self._inside: list[str] = []  # the modes of the decisions running now ("replace" | "steer")
        self._gate = StepFunctions() if gate is None else gate

    def __enter__(self) -> Lens:
        activate(self, tuple(b.op for b in BRANCHES), tuple(sorted(self.spans)))
        self._gate.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._gate.__exit__(*exc)
        deactivate(self)

    def dispatch(self, name: str, run: Callable, args, kwargs):
        """Run one call of a table op: its row's decision, else `run` (the composite kernel)."""
        row = self.table[name]
        if self.paused() or "replace" in self._inside:
            return run()  # inside a replaced span MPS runs the outer op, not this one
        decision = row.decide(args, kwargs, _grad_needed(args, kwargs), self.release.macos_at_least,
                              lambda: self.release.has_kernel(row.kernel))
        if decision is None:
            return self.span(name, run, args, kwargs) if name in self.spans else run()
        start = self.clock() if self.clock else 0
        self._inside.append(decision[0])
        try:
            out = call_through(decision[1], *args, **kwargs) if decision[0] == "steer" else run()
        finally:
            self._inside.pop()
        self._record(row, decision, start, args, kwargs, out)
        return out

    def span(self, name: str, run: Callable, args, kwargs):
        """Run one call of a span op (a composite whose C++ kernel calls other ops in other releases) and record
        the calls it dispatched as a "span" group, so a later stage can judge them by another release's kernel
        (predict/release_paths.py). Independent of the release: the trace stays one for every release."""
        if "replace" in self._inside:
            return run()  # MPS runs the replaced outer op, not this one
        start = self.clock() if self.clock else 0
        out = run()
        if self.clock is not None and self.clock() > start:
            self.groups.append(Group(
                rule=SPAN_RULE, mode="span", forward=OpKey.from_yaml(name), backward=None, start=start,
                end=self.clock(), nodes=frozenset(), dtypes=tuple(_dtype(t) for t in _tensor_args(args, kwargs)),
                module=(self.tracker.current if self.tracker else None) or "", condition=SPAN_CONDITION,
                source=SPAN_SOURCE))
        return out

    def steered(self, row, run: Callable):
        """Run a Python-level device branch the MPS way (branches.py) and record it as a "steer" group."""
        start = self.clock() if self.clock else 0
        out = run()
        if self.clock is not None:
            self.groups.append(Group(
                rule=row.rule, mode="steer", forward=None, backward=None, start=start, end=self.clock(),
                nodes=frozenset(), dtypes=(), module=(self.tracker.current if self.tracker else None) or "",
                condition=row.condition, source=row.source))
        return out

    def _record(self, row: Branch, decision, start: int, args, kwargs, out) -> None:
        if self.clock is None:
            return
        replace = decision[0] == "replace"
        self.groups.append(Group(
            rule=row.rule, mode=decision[0], forward=decision[1] if replace else None,
            backward=decision[2] if replace else None, start=start, end=self.clock(),
            nodes=frozenset(_new_nodes(out, args, kwargs)) if replace and decision[2] else frozenset(),
            dtypes=tuple(_dtype(t) for t in _tensor_args(args, kwargs)),
            module=(self.tracker.current if self.tracker else None) or "", condition=row.condition,
            source=row.source, call=_call(args, kwargs) if replace else None,
        ))


def _new_nodes(out, args, kwargs) -> set[int]:
    """Sequence numbers of the autograd nodes the call created: those reachable from its outputs without
    passing through its inputs' own nodes (the only edges into the graph that existed before it)."""
    before = {t.grad_fn._sequence_nr() for t in _tensor_args(args, kwargs) if t.grad_fn is not None}
    found: set[int] = set()
    todo = [t.grad_fn for t in _tensor_args((out,), {}) if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or type(node).__name__ == "AccumulateGrad":
            continue
        seq = int(node._sequence_nr())
        if seq in before or seq in found:
            continue
        found.add(seq)
        todo.extend(fn for fn, _ in node.next_functions)
    return found


def _call(args, kwargs):
    """The high-level call as replayable data: its tensors' metadata (dtype, shape, stride, storage offset,
    requires_grad) in argspec order, and its argspec."""
    metas = tuple((_dtype(t), tuple(t.shape), tuple(t.stride()), _offset(t), bool(t.requires_grad))
                  for t in _tensor_args(args, kwargs))
    return metas, encode(args, kwargs)


def _offset(t) -> int:
    offset = t.storage_offset()
    return offset if type(offset) is int else -1  # -1: known only at run time (fake tensors)


def _grad_needed(args, kwargs) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in _tensor_args(args, kwargs))


def _tensor_args(args, kwargs):
    out = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(_tensor_args(value, {}))
    return out


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
