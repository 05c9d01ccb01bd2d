"""Trace stage: see ops the way MPS dispatches them, above the dispatcher.

A CPU trace sees decompositions: `linear` becomes `t` + `addmm`, attention becomes the CPU flash
kernel. On MPS some composites have their own kernel, and some branch on device. This
TorchFunctionMode catches those calls before they decompose, using a small rewrite table whose every
row carries its condition and its source, and whose kernel must exist in the release's yaml:
- "replace" rows mark the span of CPU calls (and the autograd nodes they create) that MPS runs as
  one op and one backward op;
- "steer" rows run the branch MPS takes instead of the CPU one (attention with grad takes the math
  path on MPS), so the recorder sees MPS's own op list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from opscan.opkey import OpKey
from opscan.trace.argspec import encode
from opscan.trace.attribution import GradFnMapper, ModuleTracker
from opscan.trace.guard import call_through
from opscan.trace.records import Group

SRC_YAML = "native_functions.yaml: CompositeImplicitAutograd and MPS entries; derivatives.yaml backward"
SRC_RMS = "aten/src/ATen/native/layer_norm.cpp rms_norm_symint (main-branch copy; mps_facts.md §8 [INF])"
SRC_SDPA = "aten/src/ATen/native/transformers/attention.cpp SDPBackend::math (main-branch copy; mps_facts.md §8)"
SRC_LSTM = "mps_facts.md §8: at::native::lstm calls _lstm_mps for MPS input [bin]"


@dataclass(frozen=True)
class Branch:
    """One row of the rewrite table."""

    rule: str
    functions: tuple[Callable, ...]
    kernel: OpKey  # the op whose MPS kernel must exist in the release for the row to apply
    decide: Callable  # (args, kwargs, grad_needed, macos) -> ("replace", fwd, bwd) | ("steer", fn) | None
    condition: str
    source: str


def _linear(args, kwargs, grad, macos):
    return "replace", OpKey("aten", "linear"), OpKey("aten", "linear_backward")


def _max_pool2d(args, kwargs, grad, macos):
    if kwargs.get("return_indices") or (len(args) > 6 and args[6]):
        return None
    return "replace", OpKey("aten", "max_pool2d"), OpKey("aten", "max_pool2d_backward")


def _rms_norm(args, kwargs, grad, macos):
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    if weight is None or grad:
        return None  # MPS runs rms_norm_composite: the same decomposition the CPU trace shows
    return "replace", OpKey("aten", "_fused_rms_norm"), None


def _sdpa(args, kwargs, grad, macos):
    q, k, v = args[:3]
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    contiguous = all(t.is_contiguous() for t in (q, k, v))
    if dropout == 0.0 and not grad and (contiguous or macos >= (15, 0)):
        return "replace", OpKey("aten", "_scaled_dot_product_attention_math_for_mps"), None
    return "steer", _sdpa_math


def _sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]


def _lstm(args, kwargs, grad, macos):
    if len(args) != 9 or not isinstance(args[1], (tuple, list)):
        return None  # packed-sequence variant: left as traced
    return "replace", OpKey("aten", "_lstm_mps"), OpKey("aten", "lstm_mps_backward")


BRANCHES = (
    Branch("mps-linear", (F.linear,), OpKey("aten", "linear"), _linear,
           "always on MPS: linear has its own MPS kernel above its decomposition", SRC_YAML),
    Branch("mps-max-pool2d", (F.max_pool2d,), OpKey("aten", "max_pool2d"), _max_pool2d,
           "return_indices=False", SRC_YAML),
    Branch("mps-fused-rms-norm", (F.rms_norm,), OpKey("aten", "_fused_rms_norm"), _rms_norm,
           "weight given and no grad needed (else MPS runs the composite, as the CPU trace does)", SRC_RMS),
    Branch("mps-sdpa", (F.scaled_dot_product_attention,),
           OpKey("aten", "_scaled_dot_product_attention_math_for_mps"), _sdpa,
           "dropout_p == 0, no grad needed, contiguous q/k/v or macOS >= 15 → the MPS kernel; "
           "otherwise the math path (_scaled_dot_product_attention_math), never the CPU flash kernel", SRC_SDPA),
    Branch("mps-lstm", (torch.lstm,), OpKey("aten", "_lstm_mps"), _lstm,
           "nn.LSTM on padded input: _lstm_mps forward, lstm_mps_backward", SRC_LSTM),
)


class MpsLens(TorchFunctionMode):
    """Marks (or steers) the calls MPS dispatches differently; see the module docstring."""

    def __init__(self, recorder, mapper: GradFnMapper, tracker: ModuleTracker,
                 has_mps_kernel: Callable[[OpKey], bool], macos: tuple[int, int]):
        super().__init__()
        self.recorder, self.mapper, self.tracker, self.macos = recorder, mapper, tracker, macos
        self.table = {fn: b for b in BRANCHES if has_mps_kernel(b.kernel) for fn in b.functions}
        self.groups: list[Group] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        branch = self.table.get(func)
        decision = branch.decide(args, kwargs, _grad_needed(args, kwargs), self.macos) if branch else None
        if decision is None:
            return call_through(func, *args, **kwargs)
        start = len(self.recorder.calls)
        run = decision[1] if decision[0] == "steer" else func
        out = call_through(run, *args, **kwargs)
        fwd, bwd = (decision[1], decision[2]) if decision[0] == "replace" else (None, None)
        self.groups.append(Group(
            rule=branch.rule, mode=decision[0], forward=fwd, backward=bwd, start=start,
            end=len(self.recorder.calls), nodes=frozenset(self._new_nodes(out)),
            dtypes=tuple(_dtype(t) for t in _tensor_args(args, kwargs)),
            module=self.tracker.current or "", condition=branch.condition, source=branch.source,
            call=_call(args, kwargs) if decision[0] == "replace" else None,
        ))
        return out

    def _new_nodes(self, out) -> set[int]:
        seen, found = self.mapper.node_module, set()
        todo = [t.grad_fn for t in _tensor_args((out,), {}) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or type(node).__name__ == "AccumulateGrad":
                continue
            seq = int(node._sequence_nr())
            if seq in seen or seq in found:
                continue
            found.add(seq)
            todo.extend(fn for fn, _ in node.next_functions)
        return found


def _call(args, kwargs):
    """The high-level call as replayable data: its tensors' metadata in argspec order, and its argspec."""
    metas = tuple((_dtype(t), tuple(t.shape), tuple(t.stride())) for t in _tensor_args(args, kwargs))
    return metas, encode(args, kwargs)


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
