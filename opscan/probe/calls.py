"""Probe stage: the probe plan — one `ProbeCall` per distinct call signature of the step.

Each row of the report (OpKey, dtypes of the MPS view) is measured through the calls that stand for
it on the probe device:
- on `mps`, the call MPS dispatches: the recorded call itself (aten::convolution reaches
  _mps_convolution through MPS's own dispatch), or for the lens's "replace" rows a replay of the op
  MPS runs (groups.py);
- on `cpu` and `cuda`, the recorded CPU calls (for a lens row: the span of calls it replaces),
  because that is what those devices run.
Calls with the same signature (op, tensor dtypes/shapes/strides, every argument) share one probe.
A call that consumes what a forward made (saved statistics, indices, workspaces) carries that forward, which the
worker runs on the probe's device first (feeds.py); the forward is part of its signature.
A call that cannot be replayed is kept as an unreplayable entry with its reason: its row is `unknown`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from opscan.probe import feeds
from opscan.probe.groups import replay_for
from opscan.probe.protocol import Feed, ProbeCall, TensorSpec, new_call, probe_id
from opscan.probe.shrink import cap, numel
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
    saved: dict = field(default_factory=dict)  # probe id -> how its saved inputs are made (feeds.py)

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
    saved: dict[str, str] = {}
    producers = feeds.Producers(trace)
    calls = 0
    for mps_call in view:
        ids = rows.setdefault((mps_call.op, mps_call.dtypes), [])
        mine: list[str] = []
        per_call.append(mine)
        for stand_in in _stand_ins(trace, mps_call, device):
            calls += 1
            made, how = _made(stand_in, producers, device)
            if isinstance(made, str):
                key = "unreplayable:" + probe_id(made + repr(mps_call.op))
                unreplayable[key] = made
            else:
                if made.id not in probes:
                    probes[made.id] = _capped(made, mps_call, max_elements, has_builder, trace)
                    if how:
                        saved[made.id] = how
                key = made.id
            if key not in ids:
                ids.append(key)
            if key not in mine:
                mine.append(key)
    capped = sum(1 for p in probes.values() if p.shrink)
    return Plan(device, tuple(probes.values()), {k: tuple(v) for k, v in rows.items()}, unreplayable, calls,
                max_elements, capped, getattr(trace, "torch_version", ""), tuple(map(tuple, per_call)), saved)


def _made(stand_in, producers, device: str):
    """(the ProbeCall of one stand-in, or why there is none; how its saved inputs are made, or None)."""
    if isinstance(stand_in, (str, ProbeCall)):
        return stand_in, None
    made = from_call(stand_in)
    if isinstance(made, str):
        return made, None
    return feeds.with_feed(made, stand_in, producers, device, from_call)


def _capped(made: ProbeCall, mps_call, max_elements: int | None, has_builder, trace) -> ProbeCall:
    """The probe with its shapes capped (shrink.cap) — unless the call meets the size condition of a known
    silent bug of the torch that runs the probes: it runs at its real size then, and its note says so."""
    if not max_elements:
        return made
    from opscan.predict.silent import size_entry

    bug = size_entry(mps_call, getattr(trace, "torch_version", ""))
    if bug is not None and max(numel(t.shape) for t in made.tensors) > max_elements:
        return replace(made, note=f"full shapes: the call meets the size condition of known MPS silent bug "
                                  f"{bug.rule} ({bug.title}), so the element cap is lifted for it")
    return cap(made, max_elements, has_builder)


def from_call(call) -> ProbeCall | str:
    """A ProbeCall for one recorded OpCall, or why it cannot be replayed."""
    spec = call.args_spec
    if spec is None:
        return f"{call.op.display}: its arguments were not recorded"
    missing = unsupported(spec)
    if missing:
        return f"{call.op.display}: an argument of type {missing[0]} cannot be replayed in another process"
    sparse = sorted({m.layout for m in call.inputs if getattr(m, "sparse", False)})
    if sparse:  # a probe builds dense tensors: it would measure the dense kernel
        named = "/".join(sparse)
        return f"{call.op.display}: sparse layout: not modelled (a {named} input; probes build dense tensors)"
    if tensor_count(spec) != len(call.inputs):
        return f"{call.op.display}: its tensor arguments could not be matched to the recorded inputs"
    try:
        json.dumps(spec, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"{call.op.display}: an argument is not plain data ({exc})"
    values = {ref["t"]: ref.get("v") for ref in iter_tensors(spec)}
    tensors = [TensorSpec(m.dtype, m.shape, m.stride, values.get(i), max(m.offset, 0), m.host)
               for i, m in enumerate(call.inputs)]
    return make(call.op.display, tensors, _strip_values(spec))


def make(op: str, tensors, spec: dict, feed: Feed | None = None) -> ProbeCall:
    """A ProbeCall with its id (the signature's hash, with its feed's) and seed (from the id)."""
    return new_call(op, tensors, spec, feed)


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
    # predict/python_paths.py: an op an earlier release ran where the trace has another
    if mps_call.rule == "earlier-path":
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
