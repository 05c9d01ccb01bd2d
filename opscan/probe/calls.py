"""Probe stage: the probe plan — one `ProbeCall` per distinct call signature of the step.

Each row of the report (OpKey, dtypes of the MPS view) is measured through the calls that stand for
it on the probe device:
- on `mps`, the call MPS dispatches: the recorded call itself (aten::convolution reaches
  _mps_convolution through MPS's own dispatch), or for the lens's "replace" rows a replay of the op
  MPS runs (groups.py);
- on `cpu` and `cuda`, the recorded CPU calls (for a lens row: the span of calls it replaces),
  because that is what those devices run.
Calls with the same signature (op, tensor dtypes/shapes/strides, every argument) share one probe.
A call that cannot be replayed is kept as an unreplayable entry with its reason: its row is `unknown`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from opscan.probe.groups import replay_for
from opscan.probe.protocol import ProbeCall, TensorSpec, probe_id, signature
from opscan.probe.shrink import cap
from opscan.trace.argspec import iter_tensors, tensor_count, unsupported

LENS_RULES = frozenset({"mps-linear", "mps-max-pool2d", "mps-fused-rms-norm", "mps-sdpa", "mps-lstm"})


@dataclass(frozen=True)
class Plan:
    """The distinct probes, which of them each row needs, and the calls that cannot be replayed."""

    device: str
    probes: tuple[ProbeCall, ...]
    rows: dict  # (OpKey, dtypes) -> tuple of probe ids (and "unreplayable:..." ids)
    unreplayable: dict = field(default_factory=dict)  # id -> reason
    calls: int = 0  # calls stood for (a call probed through a shared signature counts once per call)
    max_elements: int | None = None
    capped: int = 0  # probes with a cap proposed (the worker applies it when the CPU accepts the capped call)
    torch: str = ""  # the torch that traced the step (and runs the probes)
    per_call: tuple = ()  # per MPS-view call, in view order: the probe ids (and "unreplayable:..." ids) it needs

    @property
    def fingerprint(self) -> str:
        """Identifies the plan: a journal from another plan is never resumed."""
        text = "|".join([self.device, str(self.max_elements), self.torch, *sorted(p.id for p in self.probes)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(trace, view, device: str, max_elements: int | None = None) -> Plan:
    """Build the plan for the MPS view of `trace`, probed on `device` (shapes capped when asked)."""
    from op_probes import builder_for

    has_builder = lambda op: builder_for(op) is not None  # noqa: E731
    probes: dict[str, ProbeCall] = {}
    unreplayable: dict[str, str] = {}
    rows: dict = {}
    per_call: list[list[str]] = []
    calls = 0
    for mps_call in view:
        ids = rows.setdefault((mps_call.op, mps_call.dtypes), [])
        mine: list[str] = []
        per_call.append(mine)
        for stand_in in _stand_ins(trace, mps_call, device):
            calls += 1
            made = stand_in if isinstance(stand_in, (str, ProbeCall)) else from_call(stand_in)
            if isinstance(made, str):
                key = "unreplayable:" + probe_id(made + repr(mps_call.op))
                unreplayable[key] = made
            else:
                if made.id not in probes:
                    probes[made.id] = cap(made, max_elements, has_builder) if max_elements else made
                key = made.id
            if key not in ids:
                ids.append(key)
            if key not in mine:
                mine.append(key)
    capped = sum(1 for p in probes.values() if p.shrink)
    return Plan(device, tuple(probes.values()), {k: tuple(v) for k, v in rows.items()}, unreplayable, calls,
                max_elements, capped, getattr(trace, "torch_version", ""), tuple(map(tuple, per_call)))


def from_call(call) -> ProbeCall | str:
    """A ProbeCall for one recorded OpCall, or why it cannot be replayed."""
    spec = call.args_spec
    if spec is None:
        return f"{call.op.display}: its arguments were not recorded"
    missing = unsupported(spec)
    if missing:
        return f"{call.op.display}: an argument of type {missing[0]} cannot be replayed in another process"
    if tensor_count(spec) != len(call.inputs):
        return f"{call.op.display}: its tensor arguments could not be matched to the recorded inputs"
    try:
        json.dumps(spec, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"{call.op.display}: an argument is not plain data ({exc})"
    values = {ref["t"]: ref.get("v") for ref in iter_tensors(spec)}
    tensors = [TensorSpec(m.dtype, m.shape, m.stride, values.get(i)) for i, m in enumerate(call.inputs)]
    return make(call.op.display, tensors, _strip_values(spec))


def make(op: str, tensors, spec: dict) -> ProbeCall:
    """A ProbeCall with its id (the signature's hash) and seed (from the id)."""
    ident = probe_id(signature(op, tensors, spec))
    return ProbeCall(ident, op, tuple(tensors), spec, int(ident[:8], 16))


def _strip_values(spec):
    if isinstance(spec, dict):
        if "t" in spec:
            return {"t": spec["t"]}
        return {k: _strip_values(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_strip_values(v) for v in spec]
    return spec


def _stand_ins(trace, mps_call, device: str) -> list:
    """The recorded calls (or a ProbeCall / a reason) that measure one MPS-view call on `device`."""
    if mps_call.rule == "earlier-path":  # predict/paths.py: an op an earlier release ran where the trace has another
        return [f"{mps_call.op.display}: an earlier release's code ran it in place of the traced "
                f"{mps_call.cpu_op.display}, whose arguments are the only ones recorded"]
    if mps_call.rule not in LENS_RULES:
        return [trace.calls[mps_call.index]]
    group, backward = _group_of(trace, mps_call)
    if group is None:
        return [f"{mps_call.op.display}: its lens span was not found in the trace"]
    span = [c for c in trace.calls[group.start:group.end] if c.parent is None and not c.bookkeeping]
    pass_calls = _backward_pass(trace, mps_call.index, group.nodes) if backward else []
    if device != "mps":
        return pass_calls if backward else span
    made = replay_for(group, span, pass_calls, backward)
    return [made if isinstance(made, str) else make(*made)]


def _group_of(trace, mps_call):
    for group in trace.groups:
        if group.mode != "replace":
            continue
        if group.forward == mps_call.op and group.start <= mps_call.index < group.end:
            return group, False
        if group.backward == mps_call.op and trace.calls[mps_call.index].node in group.nodes:
            return group, True
    return None, False


def _backward_pass(trace, first: int, nodes) -> list:
    """Top-level backward calls of the pass that starts at or before `first`, run by `nodes`."""
    out = []
    for call in trace.calls[first:]:
        if call.phase != "backward":
            break
        if call.parent is None and not call.bookkeeping and call.node in nodes:
            out.append(call)
    return out
