"""Graph stage: what the step copies between the device and the host, per call, as PyTorch does it.

Rules (docs/graph.md; sources: aten/src/ATen/native/CPUFallback.cpp, mps/operations/Copy.mm):

- Residency. The step's sources (parameters, buffers, inputs) live on the device; a constant made from
  Python data (`torch.tensor(0.0)`, first read by `aten::lift_fresh`) or a 0-dim tensor that the optimizer
  does not update is a host scalar. A call whose tensor arguments are all on the host runs on the host
  (AdamW's for-loop step counter: its `add_` and `.item()` are host work, no transfer); any other call,
  factories included, runs on the device; a call inside an explicit move (opscan.trace.moves) makes host
  tensors.
- CPU fallback (`cpu_fallback`, and `unsupported` with PYTORCH_ENABLE_MPS_FALLBACK=1): `cpu_fallback`
  copies every device tensor argument to the host (`_to_cpu`, one blocking copy each, duplicates
  included), runs the CPU kernel, then copies each mutated argument and each new result back (one blocking
  copy each). Every call, every step; each blocking copy waits for the device (Copy.mm `copy_and_sync`
  with non_blocking=false: COMMIT_AND_WAIT), so syncs = copies.
- Explicit moves: `.cpu()`, `.to("cpu")`, `.tolist()`, printing (labelled in the trace) and `.item()`
  (`aten::_local_scalar_dense`) of a device tensor copy it to the host: its bytes, one sync. A host tensor
  of one or more dimensions read by a device call must have been moved there (`.to(device)`, invisible in
  a CPU trace; `torch.tensor(data, device=...)` builds it on the host first too): its bytes host -> device,
  one sync, once per tensor (empty ones are skipped). The trace's placement model (a tensor that stays on the
  host on a Mac: `TensorMeta.host`, trace/tensors.py) marks host tensors too: a NumPy array cast on the CPU
  before its move, a `.cpu()` copy, a factory's tensor made without `device=`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

from opscan.graph.build import key_of

FALLBACK_VERDICTS = frozenset({"cpu_fallback", "unsupported"})
SCALAR_READS = frozenset({"aten::_local_scalar_dense"})


@dataclass(frozen=True)
class Cost:
    """Bytes and blocking copies (= device syncs) in each direction."""

    d2h_bytes: int = 0
    h2d_bytes: int = 0
    d2h_syncs: int = 0
    h2d_syncs: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.d2h_bytes + other.d2h_bytes, self.h2d_bytes + other.h2d_bytes,
                    self.d2h_syncs + other.d2h_syncs, self.h2d_syncs + other.h2d_syncs)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.d2h_bytes - other.d2h_bytes, self.h2d_bytes - other.h2d_bytes,
                    self.d2h_syncs - other.d2h_syncs, self.h2d_syncs - other.h2d_syncs)

    @property
    def bytes(self) -> int:
        """Both directions."""
        return self.d2h_bytes + self.h2d_bytes

    @property
    def syncs(self) -> int:
        """Both directions."""
        return self.d2h_syncs + self.h2d_syncs

    def to_dict(self) -> dict:
        """JSON form."""
        return {"d2h_bytes": self.d2h_bytes, "h2d_bytes": self.h2d_bytes, "d2h_syncs": self.d2h_syncs,
                "h2d_syncs": self.h2d_syncs, "bytes": self.bytes, "syncs": self.syncs}


NONE = Cost()


@dataclass(frozen=True)
class NodeTransfer:
    """One call's copies: `kind` fallback (the CPU fallback), explicit (a move in user code) or implicit."""

    node: str
    kind: str
    label: str
    op: str
    dtypes: str
    module: str
    phase: str
    row: int
    cost: Cost


@dataclass(frozen=True)
class Transfers:
    """The step's copies, per call (in step order), with the footprint the lane rule compares them to."""

    nodes: tuple[NodeTransfer, ...]
    host: frozenset[str]  # nodes whose results live on the host
    parameters_bytes: int  # the step's sources: parameters, buffers, inputs
    activations_bytes: int  # tensors made in the forward and loss phases

    def total(self, kind: str | None = None) -> Cost:
        """Per step, optionally of one kind."""
        return sum((n.cost for n in self.nodes if kind is None or n.kind == kind), NONE)

    def by(self, attr: str) -> dict[str, Cost]:
        """Per phase or per module ("" is the model itself)."""
        out: dict[str, Cost] = defaultdict(Cost)
        for n in self.nodes:
            out[getattr(n, attr)] += n.cost
        return dict(out)

    def ranked(self) -> list[NodeTransfer]:
        """The transfer-heavy calls first (bytes, then syncs)."""
        return sorted(self.nodes, key=lambda n: (-n.cost.bytes, -n.cost.syncs, int(n.node[1:])))

    @property
    def fallback_exceeds_footprint(self) -> bool:
        """The lane rule: the fallback moves more per step than the step's parameters and activations."""
        return self.total("fallback").bytes > self.parameters_bytes + self.activations_bytes


def account(g: nx.DiGraph) -> Transfers:
    """Walk the graph's calls in step order and price each one's copies."""
    host = {n for n, d in g.nodes(data=True) if d["kind"] == "source" and d["role"] == "constant"}
    moved: set[tuple] = set()
    out: list[NodeTransfer] = []
    for node in sorted((n for n, d in g.nodes(data=True) if d["kind"] == "call"), key=lambda n: g.nodes[n]["pos"]):
        data = g.nodes[node]
        kind, label, cost, on_host = _price(data, host, moved)
        if on_host:
            host.add(node)
        if cost != NONE:
            out.append(NodeTransfer(node, kind, label, data["op"], data["dtypes"], data["module"], data["phase"],
                                    data["row"], cost))
    return Transfers(tuple(out), frozenset(host), _sources_bytes(g), _activation_bytes(g))


def _price(data: dict, host: set, moved: set) -> tuple[str, str, Cost, bool]:
    """(kind, label, cost, results on the host) of one call."""
    args = data["args"]
    device_args = [a for a in args if a.producer not in host and not a.meta.host]
    if data["move"]:
        return "explicit", data["move"], _to_host(device_args), True
    if args and not device_args:
        return "", "", NONE, True  # host work (AdamW's for-loop step counter)
    if data["op"] in SCALAR_READS:
        return "explicit", "item()", _to_host(device_args), False
    if data["verdict"] in FALLBACK_VERDICTS:
        back = _written_back(data)
        return "fallback", "CPU fallback", _to_host(device_args) + Cost(
            h2d_bytes=sum(t.nbytes for t in back), h2d_syncs=len(back)), False
    fresh = [a for a in args if (a.producer in host or a.meta.host) and a.meta.shape and a.meta.nbytes
             and (a.producer, key_of(a.meta)) not in moved]
    moved.update((a.producer, key_of(a.meta)) for a in fresh)
    cost = Cost(h2d_bytes=sum(a.meta.nbytes for a in fresh), h2d_syncs=len(fresh))
    return ("implicit", "to(device)", cost, False) if fresh else ("", "", NONE, False)


def _to_host(args) -> Cost:
    return Cost(d2h_bytes=sum(a.meta.nbytes for a in args), d2h_syncs=len(args))


def _written_back(data: dict) -> list:
    """What cpu_fallback copies back: each result once (a mutated argument returned as the result is
    copied back once), and mutated arguments of ops that return nothing."""
    outs = list({key_of(t): t for t in data["outs"]}.values())
    if outs:
        return outs
    written = set(data["writes"])
    return [a.meta for a in data["args"] if a.meta.storage in written]


def _sources_bytes(g: nx.DiGraph) -> int:
    return sum(d["bytes"] for _, d in g.nodes(data=True) if d["kind"] == "source" and d["role"] != "constant")


def _activation_bytes(g: nx.DiGraph) -> int:
    sizes: dict[int, int] = {}
    for _, d in g.nodes(data=True):
        if d["kind"] == "call" and d["phase"] in ("forward", "loss"):
            for t in d["outs"]:
                sizes[t.storage] = max(sizes.get(t.storage, 0), t.nbytes)
    return sum(sizes.values())


@dataclass(frozen=True)
class Region:
    """Neighbouring fallback calls (linked by a tensor), and what moving them to the host explicitly costs.

    `explicit`: each tensor crossing the region's boundary copied once — in (device tensors it reads,
    except sources that only fallback calls read: `keep_on_host`, they can live on the host) and out
    (its results that a device call reads later) — instead of every argument and result of every call.
    """

    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    modules: tuple[str, ...]
    phases: tuple[str, ...]
    per_call: Cost
    explicit: Cost
    keep_on_host: tuple[str, ...]

    @property
    def saved(self) -> Cost:
        """What the explicit move saves per step."""
        return self.per_call - self.explicit


def regions(g: nx.DiGraph, transfers: Transfers) -> tuple[Region, ...]:
    """The fallback calls grouped into regions, the biggest saving first."""
    fallback = {n.node: n for n in transfers.nodes if n.kind == "fallback"}
    linked = nx.Graph()
    linked.add_nodes_from(fallback)
    linked.add_edges_from((u, v) for u, v in g.edges if u in fallback and v in fallback)
    keep = {s for s, d in g.nodes(data=True) if d["kind"] == "source" and s not in transfers.host
            and g.out_degree(s) and all(v in fallback for v in g.successors(s))}
    out = [_region(g, sorted(part, key=lambda n: int(n[1:])), fallback, keep, transfers.host)
           for part in nx.connected_components(linked)]
    return tuple(sorted(out, key=lambda r: (-r.saved.bytes, -r.saved.syncs, int(r.nodes[0][1:]))))


def _region(g, nodes: list[str], fallback: dict, keep: set, host: frozenset) -> Region:
    inside = set(nodes)
    into: dict[tuple, int] = {}
    for n in nodes:
        for a in g.nodes[n]["args"]:
            if a.producer not in inside and a.producer not in host and a.producer not in keep:
                into[(a.producer, key_of(a.meta))] = a.meta.nbytes
    back: dict[tuple, int] = {}
    for n in nodes:
        for succ in g.successors(n):
            if succ not in inside and succ not in host:
                back.update(((n, key_of(a.meta)), a.meta.nbytes) for a in g.nodes[succ]["args"] if a.producer == n)
    used = [_describe(g, s) for s in sorted({a.producer for n in nodes for a in g.nodes[n]["args"]} & keep,
                                              key=lambda s: int(s[1:]))]
    return Region(
        nodes=tuple(nodes), ops=tuple(dict.fromkeys(fallback[n].op for n in nodes)),
        modules=tuple(dict.fromkeys(fallback[n].module for n in nodes)),
        phases=tuple(dict.fromkeys(fallback[n].phase for n in nodes)),
        per_call=sum((fallback[n].cost for n in nodes), NONE),
        explicit=Cost(sum(into.values()), sum(back.values()), len(into), len(back)),
        keep_on_host=tuple(used),
    )


def _describe(g: nx.DiGraph, source: str) -> str:
    d = g.nodes[source]
    return f"{d['role']} {d['dtype']}[{d['shape']}] read in {d['module'] or '(model)'} ({source})"


ASSUMES = ("PYTORCH_ENABLE_MPS_FALLBACK=1 (unsupported calls run through the CPU fallback); one step as traced; "
           "every blocking copy is one device sync (mps/operations/Copy.mm copy_and_sync)")


def transfer_section(t: Transfers, found: tuple[Region, ...], top: int = 25) -> dict:
    """The report's `transfers` section."""
    kinds = {k: {**t.total(k).to_dict(), "calls": sum(1 for n in t.nodes if n.kind == k)}
             for k in ("fallback", "explicit", "implicit")}
    return {
        "assumes": ASSUMES,
        "step": t.total().to_dict(),
        **kinds,
        "by_phase": {k: c.to_dict() for k, c in t.by("phase").items()},
        "by_module": {k: c.to_dict() for k, c in sorted(t.by("module").items(), key=lambda kv: -kv[1].bytes)},
        "ranking": [_ranked(n) for n in t.ranked()[:top]],
        "regions": [_region_dict(r) for r in found[:top]],
        "footprint": {"parameters_bytes": t.parameters_bytes, "activations_bytes": t.activations_bytes,
                      "fallback_bytes": t.total("fallback").bytes,
                      "fallback_exceeds": t.fallback_exceeds_footprint},
    }


def _ranked(n: NodeTransfer) -> dict:
    return {"node": n.node, "kind": n.kind, "label": n.label, "op": n.op, "dtypes": n.dtypes,
            "module": n.module, "phase": n.phase, "row": n.row, **n.cost.to_dict()}


def _region_dict(r: Region) -> dict:
    return {"nodes": list(r.nodes), "ops": list(r.ops), "modules": list(r.modules), "phases": list(r.phases),
            "per_call": r.per_call.to_dict(), "explicit": r.explicit.to_dict(), "saved": r.saved.to_dict(),
            "keep_on_host": list(r.keep_on_host)}
