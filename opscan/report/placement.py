"""Report stage: a row's placement — host tensors that reach MPS kernels — as the row's `placement` and its causes.

A row some of whose calls the placement model decided (predict/placement.py: a host tensor its MPS kernel refuses,
`error`, or one whose fate is not established, `unknown`) gets a `placement` section, what the lane and the repro
stage read:

    {"verdict": "error", "rule": "placement-loss-target", "hardware_verdict": "native"}

`hardware_verdict` is the row's verdict apart from those calls (graph/lanes.py): a placement finding is a bug of the
user's code, not a limit of MPS. When the row's verdict is the placement model's, the row names its causes
(`Row.causes`): one entry per line that made a host tensor those calls read (the trace's HostSources), shaped like
a `where` entry (file, line, function, text, cell, by, via, phases, calls) with what the tensor is and the fix there
and the lines where it met the MPS kernels:

    {"file": "examples/cnn.py", "line": 21, "function": "<module>", "by": "call", "via": null, "cell": null,
     "text": "TARGETS = torch.tensor([3, 7])", "phases": ["loss"], "calls": 1,
     "kind": "global", "name": "TARGETS", "first_read": false, "what": "module-level tensor TARGETS: …",
     "fix": "…", "met": [<`where` entries of the calls that read it>]}

so report/findings.py puts one finding per host tensor at the line that made it. Pure data, no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opscan.report.where import place_entry, places

_FIX = {
    "factory": "pass device= to {name} (device=x.device, with x a tensor of the step) where it is called",
    "global": "move {name} to the step's device where the step uses it ({name}.to(out.device)), or make it there",
    "closure": "move {name} to the step's device where the step uses it ({name}.to(out.device)), or make it there",
    "attribute": "register it as a buffer (self.register_buffer('{attr}', ...)): model.to(device) moves buffers, "
                 "not plain tensor attributes",
    "before-step": "move it to the step's device (.to(device)) before it meets the step's tensors",
    "to-host": "hand the step's tensors the device tensor itself, or move the host copy back (.to(device)) first",
}
_WHAT = {
    "factory": "{name}(…) called without device=: made on the CPU",
    "global": "module-level tensor {name}: model.to(device) leaves it on the CPU",
    "closure": "tensor {name} a function of the step closes over: it stays on the CPU",
    "attribute": "plain tensor attribute {name}, not a registered buffer: model.to(device) leaves it on the CPU",
    "before-step": "a tensor made before the step (torch.from_numpy, a DataLoader batch, a tensor held elsewhere) "
                   "and not moved to the device",
    "to-host": "the host copy {name} makes: it stays on the CPU",
}


def with_placement(use, worst, group, hosts, trace_calls, project: str | None):
    """(use with its `placement` section and, when `worst` — the row's classification — is the placement model's,
    its causes; worst) for a row some of whose calls the placement model decided. `group`: the row's (call,
    classification) pairs; `hosts`: the trace's HostSources."""
    decided = [(c, f) for c, f in group if f.hardware is not None]
    if not decided:
        return use, worst
    placement = max((f for _, f in decided), key=lambda f: f.verdict.rank)
    apart = [f.hardware for _, f in decided] + [f for _, f in group if f.hardware is None]
    hardware = max(apart, key=lambda f: f.verdict.rank)
    section = {"verdict": placement.verdict.value, "rule": placement.evidence.rule,
               "hardware_verdict": hardware.verdict.value}
    causes = origins([c for c, _ in decided], hosts, trace_calls, project) if worst.hardware is not None else ()
    return replace(use, placement=section, causes=causes), worst


def origins(calls, hosts, trace_calls, project: str | None) -> tuple[dict[str, Any], ...]:
    """One cause per line that made a host tensor `calls` read (a layer's factory call is a source per layer: one
    entry per line and name), with the calls that read it, their phases and the lines where they were made."""
    by_id = {h.id: h for h in hosts}
    readers: dict[tuple, tuple[Any, list]] = {}
    for call in calls:
        ids = dict.fromkeys(i for t in call.inputs if t.host for i in t.host_from if i in by_id)
        for host in (by_id[i] for i in ids):
            where = host.where
            key = (where.file, where.line, host.name, host.kind) if where else (None, None, host.name, host.kind)
            found = readers.setdefault(key, (host, []))[1]
            if not found or found[-1] is not call:  # two hosts of one line (a factory per layer) read by one call
                found.append(call)
    return tuple(_origin(host, read, trace_calls, project) for host, read in readers.values())


def _origin(host, calls, trace_calls, project: str | None) -> dict[str, Any]:
    """A HostSource as a cause: a `where`-shaped entry of the line that made it, with what it is, the fix there and
    where the calls that read it met MPS kernels."""
    name = host.name or "the tensor"
    if host.where is not None:
        site = place_entry(host.where, "factory" if host.where.by == "factory" else "call", project)
    else:
        site = {"file": None, "line": None, "function": None, "by": "call", "via": None, "text": None, "cell": None}
    site["phases"] = list(dict.fromkeys(c.phase for c in calls))
    site["calls"] = len(calls)
    return {**site, "kind": host.kind, "name": host.name, "first_read": host.first_read,
            "what": _WHAT[host.kind].format(name=name),
            "fix": _FIX[host.kind].format(name=name, attr=name.rsplit(".", 1)[-1]),
            "met": list(places(calls, trace_calls, project))}
