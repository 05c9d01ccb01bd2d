"""Report stage: the placement findings — host tensors that reach MPS kernels — per row and per host tensor.

A row some of whose calls the placement model decided (predict/placement.py: a host tensor its MPS kernel refuses,
`error`, or one whose fate is not established, `unknown`) gets a `placement` section:

    {"verdict": "error", "rule": "placement-loss-target", "hardware_verdict": "native",
     "origins": [{"file": "examples/cnn.py", "line": 21, "function": "<module>", "by": "call", "via": null,
                  "kind": "global", "name": "TARGETS", "text": "TARGETS = torch.tensor([3, 7])", "fix": "…",
                  "first_read": false}],
     "met": [<the row's `where` entries of those calls>]}

`origins` are where the host tensors of those calls were made (the trace's HostSources: the same shape as a `where`
entry, with what it is and how to fix it there), `met` the lines where they met the kernel. `hardware_verdict` is the
row's verdict apart from them — what the lane reads (graph/lanes.py): a placement finding is a bug of the user's
code, not a limit of MPS. The report's `placement` section lists one finding per host tensor, at the line that made
it, with the rows and lines where it met MPS kernels (`findings`). Pure data, no torch.
"""

from __future__ import annotations

import linecache
from dataclasses import replace
from typing import Any

from opscan.report.where import places
from opscan.target.user_code import relative_to
from opscan.verdict import Source, Verdict

_FIX = {
    "factory": "pass device= to {name} (device=x.device, with x a tensor of the step) where it is called",
    "global": "move {name} to the step's device where the step uses it ({name}.to(out.device)), or make it there",
    "closure": "move {name} to the step's device where the step uses it ({name}.to(out.device)), or make it there",
    "attribute": "register it as a buffer (self.register_buffer('{attr}', ...)): model.to(device) moves buffers, "
                 "not plain tensor attributes",
    "before-step": "move it to the step's device (.to(device)) before it meets the step's tensors",
}
_WHAT = {
    "factory": "{name}(…) called without device=: made on the CPU",
    "global": "module-level tensor {name}: model.to(device) leaves it on the CPU",
    "closure": "tensor {name} a function of the step closes over: it stays on the CPU",
    "attribute": "plain tensor attribute {name}, not a registered buffer: model.to(device) leaves it on the CPU",
    "before-step": "a tensor made before the step (torch.from_numpy, a DataLoader batch, a tensor held elsewhere) "
                   "and not moved to the device",
}


def with_placement(use, worst, group, hosts, trace_calls, project: str | None):
    """(use with its `placement` section, worst) for a row some of whose calls the placement model decided;
    `group`: the row's (call, classification) pairs; `hosts`: the trace's HostSources."""
    decided = [(c, f) for c, f in group if f.hardware is not None]
    if not decided:
        return use, worst
    placement = max((f for _, f in decided), key=lambda f: f.verdict.rank)
    apart = [f.hardware for _, f in decided] + [f for _, f in group if f.hardware is None]
    hardware = max(apart, key=lambda f: f.verdict.rank)
    by_id = {h.id: h for h in hosts}
    ids = dict.fromkeys(i for c, _ in decided for t in c.inputs if t.host for i in t.host_from)
    origins: dict[tuple, dict[str, Any]] = {}  # one per line (a layer's factory call is a source per layer)
    for found in (origin(by_id[i], project) for i in ids if i in by_id):
        origins.setdefault((found["file"], found["line"], found["name"], found["kind"]), found)
    section = {
        "verdict": placement.verdict.value, "rule": placement.evidence.rule,
        "hardware_verdict": hardware.verdict.value,
        "origins": list(origins.values()),
        "met": list(places([c for c, _ in decided], trace_calls, project)),
    }
    return replace(use, placement=section), worst


def origin(host, project: str | None) -> dict[str, Any]:
    """A HostSource as a `where`-shaped entry, with what it is, its line's text and the fix there."""
    where = host.where
    name = host.name or "the tensor"
    attr = name.rsplit(".", 1)[-1]
    text = linecache.getline(where.file, where.line).strip() if where and where.file and where.line else ""
    return {
        "file": relative_to(where.file, project) if where and where.file else None,
        "line": where.line if where else None, "function": where.function if where else None,
        "by": "factory" if where and where.by == "factory" else "call",
        "via": {"file": where.via[0], "line": where.via[1], "function": where.via[2]} if where and where.via else None,
        "kind": host.kind, "name": host.name, "text": text, "first_read": host.first_read,
        "what": _WHAT[host.kind].format(name=name), "fix": _FIX[host.kind].format(name=name, attr=attr),
    }


def placement_section(rows) -> dict[str, Any] | None:
    """The report's `placement` section: one finding per host tensor that met MPS kernels (at the line that made
    it), with the rows and lines it met them at; None when no row has a placement section."""
    findings: dict[tuple, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        if row.placement is None:
            continue
        for place in row.placement["origins"]:
            key = (place["file"], place["line"], place["name"], place["kind"])
            found = findings.setdefault(key, {"origin": place, "verdict": row.placement["verdict"], "rows": [],
                                              "ops": [], "met": []})
            found["rows"].append(i)
            found["ops"].append(row.op.display)
            if Verdict(row.placement["verdict"]).rank > Verdict(found["verdict"]).rank:
                found["verdict"] = row.placement["verdict"]
            for met in row.placement["met"]:
                if (met["file"], met["line"]) not in {(m["file"], m["line"]) for m in found["met"]}:
                    found["met"].append(met)
    if not findings:
        return None
    listed = list(findings.values())
    return {"source": Source.PREDICTED.value, "findings": listed,
            "errors": sum(1 for f in listed if f["verdict"] == Verdict.ERROR.value)}


def finding_text(finding: dict[str, Any]) -> str:
    """One finding as a line: what and where it was made, where it met MPS kernels, the fix."""
    o = finding["origin"]
    at = f"{o['file']}:{o['line']}" if o.get("file") else "(no line known)"
    first = " (first read there; made before the step)" if o.get("first_read") else ""
    met = ", ".join(f"{(m.get('file') or '').rsplit('/', 1)[-1]}:{m.get('line')}" for m in finding["met"][:5])
    ops = ", ".join(dict.fromkeys(finding["ops"]))
    verdict = "raises there" if finding["verdict"] == Verdict.ERROR.value else "may raise there (not established)"
    return (f"{at}{first}: {o['what']}; it meets MPS kernels at {met or 'the step'} ({ops}), which {verdict}. "
            f"Fix: {o['fix']}")
