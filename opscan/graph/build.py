"""Graph stage: the step as a networkx graph — MPS-view calls linked by the tensors they pass.

Nodes `c<pos>` are the calls of the MPS view (position `pos` in it) with their OpKey, verdict, phase,
module, dtypes, shapes and bytes in/out. Nodes `s<storage>` are the tensors the step reads but no call
made: parameters, buffers, inputs, and constants built from Python data (`torch.tensor(0.0)`, the first
consumer is `aten::lift_fresh`). An edge producer -> consumer carries the bytes of the distinct tensors
passed along it.

Edges come from the trace's storage identities, walked call by call in the CPU trace (so a call that
MPS runs as one op — `linear`, `max_pool2d`, attention — gets the inputs of every CPU call it stands for,
minus what it made itself). A read of tensor T links to the latest call that produced this alias of T
(same storage, shape and stride) or wrote T's storage in place, whichever came last; else to T's source
node. Pure: never imports a later stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx

from opscan.markers import move_labels

if TYPE_CHECKING:
    from opscan.trace.records import TensorMeta

CONSTANT_MAKERS = frozenset({"aten::lift_fresh", "aten::lift", "aten::lift_fresh_copy"})


@dataclass(frozen=True)
class Arg:
    """One tensor argument of a node and the node that produced it."""

    meta: TensorMeta
    producer: str


def key_of(meta: TensorMeta) -> tuple:
    """An alias of a storage: the same storage seen with the same shape and stride."""
    return meta.storage, meta.shape, meta.stride


def build_graph(trace, view, verdicts) -> nx.DiGraph:
    """The step graph of `view` (the MPS view of `trace`), one verdict per view call."""
    g = nx.DiGraph(model=trace.model_class, step=trace.mode, device=trace.device)
    labels = move_labels(trace.calls)
    rows: dict[tuple, int] = {}
    for pos, (call, verdict) in enumerate(zip(view, verdicts)):
        row = rows.setdefault((call.op, call.dtypes), len(rows))
        g.add_node(f"c{pos}", **_call_attrs(pos, call, verdict, row, labels.get(call.index, "")))
    flow = _Flow(g, meta_device=trace.device != "meta")
    added: dict[int, list[int]] = {}  # the view's index-nonzero calls (no trace call of their own), by index
    for pos, call in enumerate(view):
        if call.rule == "index-nonzero":
            added.setdefault(call.index, []).append(pos)
    for call, first, last, group in _units(trace, _owners(trace, view)):
        for pos in added.pop(call.index, ()):  # the nonzero its index kernel runs: it reads the mask first
            flow.read(f"c{pos}", view[pos].inputs, dedupe=False)
            flow.write(f"c{pos}", view[pos])
        flow.read(first, call.inputs, dedupe=group)
        flow.write(last, call)
    flow.finish()
    return g


def _call_attrs(pos: int, call, verdict, row: int, move: str) -> dict:
    return {
        "kind": "call", "pos": pos, "index": call.index, "op": call.op.display,
        "verdict": getattr(verdict, "value", str(verdict)), "phase": call.phase, "module": call.module,
        "dtypes": ",".join(call.dtypes), "shapes": ";".join("x".join(map(str, t.shape)) for t in call.inputs),
        "bytes_out": sum(t.nbytes for t in call.outputs), "row": row, "rule": call.rule or "",
        "cpu_op": call.cpu_op.display if call.cpu_op else "", "move": move,
        "args": [], "outs": [], "writes": [],  # Arg list, output metas, storages written (not in GraphML)
    }


def _owners(trace, view) -> dict[int, int]:
    """CPU-trace call index -> position of the MPS-view call that stands for it."""
    owner = {c.index: p for p, c in enumerate(view)}
    for group in trace.groups:
        if group.mode != "replace":
            continue
        first = next((i for i in range(group.start, group.end) if _top(trace.calls[i])), group.start)
        if first in owner:
            owner.update(dict.fromkeys(range(group.start, group.end), owner[first]))
    by_node = {n: g for g in trace.groups if g.mode == "replace" and g.backward for n in g.nodes}
    passes, previous, firsts = 0, "", {}
    for call in trace.calls:
        if call.phase == "backward" and previous != "backward":
            passes += 1
        previous = call.phase
        group = by_node.get(call.node) if call.phase == "backward" and _top(call) else None
        if group is not None:
            first = firsts.setdefault((group.start, passes), call.index)
            if first in owner:
                owner[call.index] = owner[first]
        if call.parent is not None and call.index not in owner and call.parent in owner:
            owner[call.index] = owner[call.parent]
    return owner


def _top(call) -> bool:
    return call.parent is None and not call.bookkeeping


def _units(trace, owner):
    """(call, reading node, writing node, part of a multi-call node) for each call that carries data."""
    children: dict[int, list] = {}
    for call in trace.calls:
        if call.parent is not None:
            children.setdefault(call.parent, []).append(call)
    skip: set[int] = set()
    sizes = Counter(owner.values())
    for call in trace.calls:
        if call.bookkeeping or call.index in skip or call.index not in owner:
            continue
        kids = children.get(call.index, [])
        node = f"c{owner[call.index]}"
        if kids and _on_meta(kids) and not _on_meta([call]):  # callees re-run on meta: the call's own tensors
            leaves = _descendants(call.index, children)
            skip.update(c.index for c in leaves)
            owned = [f"c{owner[c.index]}" for c in leaves if c.index in owner] or [node]
            yield call, owned[0], owned[-1], False
        elif not kids or all(owner.get(k.index) == owner[call.index] for k in kids):
            yield call, node, node, sizes[owner[call.index]] > 1


def _on_meta(calls) -> bool:
    return any(t.device == "meta" for c in calls for t in (*c.inputs, *c.outputs))


def _descendants(index: int, children) -> list:
    out = []
    for child in children.get(index, []):
        out.append(child)
        out.extend(_descendants(child.index, children))
    return out


class _Flow:
    """Who produced each alias and who last wrote each storage, as the walk goes."""

    def __init__(self, g: nx.DiGraph, meta_device: bool):
        self.g, self.skip_meta = g, meta_device
        self.alias: dict[tuple, tuple[int, str]] = {}
        self.writer: dict[int, tuple[int, str]] = {}
        self.order = 0
        self.seen: dict[str, set] = {}

    def producer(self, meta: TensorMeta) -> str:
        found = max((self.alias.get(key_of(meta), (-1, "")), self.writer.get(meta.storage, (-1, ""))))
        return found[1] or self._source(meta)

    def read(self, node: str, metas, dedupe: bool) -> None:
        seen = self.seen.setdefault(node, set())
        args = self.g._node[node]["args"]  # (networkx's own dicts: no view object per access)
        for meta in metas:
            if meta.storage < 0 or (self.skip_meta and meta.device == "meta"):
                continue
            source = self.producer(meta)
            if source == node or (dedupe and key_of(meta) in seen):
                continue
            seen.add(key_of(meta))
            args.append(Arg(meta, source))
            self._edge(source, node, meta)

    def write(self, node: str, call) -> None:
        self.order += 1
        inputs = {t.storage for t in call.inputs}
        mutates = call.op.name.endswith("_") or call.op.overload.startswith("out") or "_out" in call.op.overload
        attrs = self.g._node[node]
        for meta in call.outputs:
            if meta.storage < 0:
                continue
            self.alias[key_of(meta)] = (self.order, node)
            attrs["outs"].append(meta)
            if mutates and meta.storage in inputs:
                self.writer[meta.storage] = (self.order, node)
                attrs["writes"].append(meta.storage)
        if mutates and not call.outputs and call.inputs:  # void in-place ops (_foreach_*_): the first argument
            count = len(call.attrs[0]) if call.attrs and isinstance(call.attrs[0], list) else 1
            for meta in call.inputs[:count]:
                self.writer[meta.storage] = (self.order, node)
                attrs["writes"].append(meta.storage)

    def _edge(self, source: str, node: str, meta: TensorMeta) -> None:
        data = self.g._succ[source].get(node)
        if data is not None:
            if key_of(meta) not in data["keys"]:
                data["keys"].add(key_of(meta))
                data["bytes"] += meta.nbytes
                data["tensors"] += 1
        else:
            self.g.add_edge(source, node, bytes=meta.nbytes, tensors=1, keys={key_of(meta)})

    def _source(self, meta: TensorMeta) -> str:
        node = f"s{meta.storage}"
        data = self.g._node.get(node)
        if data is None:
            self.g.add_node(node, kind="source", storage=meta.storage, dtype=meta.dtype,
                            shape="x".join(map(str, meta.shape)), bytes=meta.nbytes, role="input", module="",
                            phase="", op="")
        elif meta.nbytes > data["bytes"]:
            data["bytes"] = meta.nbytes
        self.writer.setdefault(meta.storage, (0, node))
        return node

    def finish(self) -> None:
        """Name each source's role and module, and each edge's kind, from what read and wrote it."""
        g = self.g
        for _, data in g.nodes(data=True):
            if data["kind"] == "call":
                data["bytes_in"] = sum(a.meta.nbytes for a in data["args"])
        written_by_optimizer = {s for n, d in g.nodes(data=True) if d["kind"] == "call"
                                and d["phase"] == "optimizer" for s in d["writes"]}
        nodes = g._node
        for node, data in g.nodes(data=True):
            if data["kind"] == "source":
                first = min(g._succ[node], key=lambda n: nodes[n]["pos"], default=None)
                first_data = nodes[first] if first is not None else {"module": "", "phase": "", "op": ""}
                data["module"], data["phase"] = first_data["module"], first_data["phase"]
                data["role"] = _role(data, first_data["op"], written_by_optimizer)
        for u, v, data in g.edges(data=True):
            data["kind"] = edge_kind(nodes[u], nodes[v])


def _role(source: dict, first_op: str, written_by_optimizer: set) -> str:
    """parameter (the optimizer updates it), constant (host: Python data or a 0-dim scalar) or input."""
    if first_op.split(".")[0] in CONSTANT_MAKERS:
        return "constant"
    if source["storage"] in written_by_optimizer:
        return "parameter"
    return "constant" if source["shape"] == "" else "input"


def edge_kind(src: dict, dst: dict) -> str:
    """parameter, constant, input, gradient, optimizer-state or activation."""
    if src["kind"] == "source":
        return src["role"]
    if dst["phase"] == "optimizer":
        return {"backward": "gradient", "optimizer": "optimizer-state"}.get(src["phase"], "activation")
    return "activation"
