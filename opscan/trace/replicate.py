"""Trace stage: the full trace assembled from a short run (repeat.py) — the proof, the copies, the numbering.

`replicate(...)` checks that layers 1 and 2 gave equal units and that nothing outside the layers touched
theirs (else `Refused`), inserts layer 2's units decoded at positions 3 .. N-2 where a full run makes them
(forward: before layer N-1's; backward: before layer 2's, last layer first; each optimizer loop: before
layer N-1's parameters), re-decodes every real unit at its full position, moves the lens groups with their
calls, and numbers the storages as a full trace meets them (`renumber`). `Assembled.order` says, per call of
the full trace, which short-run call it is and at which position (None: the call itself), for the memory
events (opscan/memory/tracker.py `replicate`). `Shortcut` is what trace_step holds: the stack (or none), the
short run around the step, and the assembly after it (`Retrace` when the short run proved nothing).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch

from opscan.trace.records import OpCall, TensorMeta
from opscan.trace.fxnodes import _scope
from opscan.trace.repeat import Marks, Retrace, Stack, find_stack, sequence_nr, short_run
from opscan.trace.splice import Coder, Refused, Units, pairs


@dataclass(frozen=True)
class Assembled:
    """The full trace's calls and groups, and where each call came from: (short-run index, position or None)."""

    calls: tuple[OpCall, ...]
    groups: tuple
    order: tuple[tuple[int, int | None], ...]
    inserts: tuple[tuple[int, tuple[int, ...], range], ...]  # (before short-run index, positions, layer 2's unit)


def replicate(calls, groups, units: Units, coder: Coder, first_free: int) -> Assembled:
    """The full trace (see the module docstring), or Refused."""
    where = {i: (k, unit) for k, unit in [*enumerate(units.fwd), *enumerate(units.bwd), *units.opt] for i in unit}
    if coder.seqs[2] - coder.seqs[1] != coder.kseq:
        raise Refused("layers 1 and 2 made different numbers of autograd nodes")
    inserts = []
    middle = range(3, coder.n - 1)
    for u1, u2, before in pairs(units):
        _prove(calls, u1, u2, coder)
        backward = calls[u2.start].phase == "backward"
        inserts.append((before.start, tuple(reversed(middle)) if backward else tuple(middle), u2))
    _outside(calls, units, coder)
    order = order_of(len(calls), inserts)
    new_of = {item: n for n, item in enumerate(order)}
    walker = Walker(first_free)
    codes: dict[int, OpCall] = {}
    for n, (i, fp) in enumerate(order):
        c = calls[i]
        if fp is None and i not in where:
            parent = None if c.parent is None else new_of[(c.parent, None)]
            walker.add(replace(c, node=coder.unnode(("G", c.node), 0), parent=parent),
                       [(t, t.storage) for t in c.inputs], [(t, t.storage) for t in c.outputs])
            continue
        k, unit = (2, where[i][1]) if fp is not None else where[i]
        code = codes.get(i) or codes.setdefault(i, coder.call(c, k, unit))
        walker.add(*coder.decode(code, coder.full(k) if fp is None else fp, _parents(new_of, unit, fp)))
    return Assembled(walker.done(), _groups(groups, where, units, coder, new_of, inserts, len(order)),
                     tuple(order), tuple(inserts))


def _prove(calls, u1: range, u2: range, coder: Coder) -> None:
    if len(u1) != len(u2):
        raise Refused(f"layers 1 and 2 made {len(u1)} and {len(u2)} {calls[u1.start].phase} calls")
    for i, j in zip(u1, u2):
        if not coder.equal(coder.call(calls[i], 1, u1), coder.call(calls[j], 2, u2)):
            c = calls[j]
            raise Refused(f"layers 1 and 2 differ at their {c.phase} call {j - u2.start + 1} "
                          f"({calls[i].op.display} vs {c.op.display} in {c.module})")


def _outside(calls, units: Units, coder: Coder) -> None:
    """Nothing outside the layers' units may touch layer 1's or 2's tensors or autograd nodes."""
    for c in calls:
        if units.owner[c.index] is not None:
            continue
        for t in (*c.inputs, *c.outputs):
            found = coder.ids.get(t.storage)
            if found and found[1] in (1, 2):
                raise Refused(f"a {c.phase} call outside the layers ({c.op.display} in {c.module or 'the model'}) "
                              "touches the middle layers' tensors")
        code = coder.node(c.node, 0)
        if code[0] == "N" and code[1] in (1, 2):
            raise Refused(f"a {c.phase} call outside the layers runs a middle layer's autograd node")


def order_of(count: int, inserts) -> list[tuple[int, int | None]]:
    """(short-run index, position or None) of every call of the full run: the short run's with each insert's
    copies (layer 2's unit at each of its positions) before its index."""
    before = {at: (positions, unit) for at, positions, unit in inserts}
    order: list[tuple[int, int | None]] = []
    for i in range(count):
        found = before.get(i)
        if found is not None:
            positions, unit = found
            for fp in positions:
                order.extend((j, fp) for j in unit)
        order.append((i, None))
    return order


def _parents(new_of, unit: range, fp):
    def parent_of(code):
        if code is None:
            return None
        if code[0] == "R":
            return new_of[(unit.start + code[1], fp)]
        if fp is not None:
            raise Refused("a composite's callees straddle a layer's unit")
        return new_of[(code[1], None)]
    return parent_of


def _groups(groups, where, units, coder: Coder, new_of, inserts, total: int) -> tuple:
    def new(i: int, fp) -> int:
        return new_of[(i, fp)] if i < len(units.owner) else total

    keyed = []
    copies = {id(unit): positions for _, positions, unit in inserts}
    for seq, g in enumerate(groups):
        inside = where.get(g.start) if g.end > g.start else None
        if inside is None or (g.end - 1) not in inside[1]:
            start = new(g.start, None)
            end = new_of[(g.end - 1, None)] + 1 if g.end > g.start else start
            keyed.append(((end, seq), _regroup(g, start, end, coder, None, None)))
            continue
        k, unit = inside
        fp = coder.full(k)
        keyed.append(((new_of[(g.end - 1, None)] + 1, seq), _regroup(g, new(g.start, None),
                                                                      new_of[(g.end - 1, None)] + 1, coder, k, fp)))
        for at in copies.get(id(unit), ()) if k == 2 else ():
            end = new_of[(g.end - 1, at)] + 1
            keyed.append(((end, seq), _regroup(g, new_of[(g.start, at)], end, coder, 2, at)))
    return tuple(g for _, g in sorted(keyed, key=lambda kg: kg[0]))


def _regroup(g, start: int, end: int, coder: Coder, k, fp):
    if k is None:
        nodes = frozenset(coder.unnode(("G", n), 0) for n in g.nodes)
        return replace(g, start=start, end=end, nodes=nodes)
    nodes = frozenset(coder.unnode(coder.node(n, k), fp) for n in g.nodes)
    module = coder._unmodule(coder._module(g.module, k), fp)
    return replace(g, start=start, end=end, nodes=nodes, module=module)


class Walker:
    """Builds the full trace's calls in order, numbering storages as the recorder meets them in a full run: ids
    below `first_free` (given before the step: parameters, buffers, inputs) kept, every other id by first sight
    — a call's inputs, then its composite callees, then its outputs (an expanded call stays open until a call
    that is not its callee comes)."""

    def __init__(self, first_free: int):
        self.first_free = first_free
        self.ids: dict[int, int] = {}
        self.metas: dict[tuple[int, int], TensorMeta] = {}
        self.calls: list = []
        self._open: list[int] = []

    def add(self, call: OpCall, ins: list, outs: list) -> None:
        """One call, its index, inputs and outputs yet to be set: ins and outs as (TensorMeta, storage id before
        numbering) (see splice.Coder.decode)."""
        while self._open and self._open[-1] != call.parent:
            self._close(self._open.pop())
        n = len(self.calls)
        self.calls.append((call, tuple(self._meta(t, s) for t, s in ins), outs))
        if call.expanded:
            self._open.append(n)
        else:
            self._close(n)

    def done(self) -> tuple[OpCall, ...]:
        """The calls, every one closed."""
        while self._open:
            self._close(self._open.pop())
        return tuple(self.calls)

    def _close(self, n: int) -> None:
        call, ins, outs = self.calls[n]
        self.calls[n] = replace(call, index=n, inputs=ins, outputs=tuple(self._meta(t, s) for t, s in outs))

    def _meta(self, t: TensorMeta, sid: int) -> TensorMeta:
        if sid >= self.first_free:
            found = self.ids.get(sid)
            if found is None:
                found = self.ids[sid] = self.first_free + len(self.ids)
            sid = found
        if sid == t.storage:
            return t
        key = (id(t), sid)
        meta = self.metas.get(key)
        if meta is None:
            meta = self.metas[key] = replace(t, storage=sid)
        return meta


def renumber(calls, first_free: int) -> tuple[OpCall, ...]:
    """The calls with their storages numbered as a full run meets them (Walker)."""
    walker = Walker(first_free)
    for c in calls:
        walker.add(c, [(t, t.storage) for t in c.inputs], [(t, t.storage) for t in c.outputs])
    return walker.done()


class Shortcut:
    """The repeated-layers shortcut of one trace: off (`stack` None), or the stack it runs short."""

    def __init__(self, stack: Stack | None, fx_names: dict, notes: tuple[str, ...] = ()):
        self.stack, self.fx_names, self.notes = stack, fx_names, notes
        self.marks = Marks()
        self.param_ids: dict[int, tuple[int, ...]] = {}
        self.first_free = 0

    @classmethod
    def of(cls, model: torch.nn.Module, graph, wanted: bool) -> Shortcut:
        """The shortcut for `model` (`graph`: its fx graph or None) when `wanted`, else one that is off."""
        if not wanted:
            return cls(None, {})
        stack, refused = find_stack(model)
        if stack is None:
            return cls(None, {}, (f"repeated layers: {refused}; every layer traced",) if refused else ())
        names = fx_names(graph, stack) if graph is not None else {}
        return cls(stack, names)

    @contextlib.contextmanager
    def running(self, recorder, below):
        """While the step runs: layers 0, 1, 2 and N-1 only, their starts marked, each call's memory events."""
        if self.stack is None:
            yield
            return
        self.param_ids = {q: tuple(recorder.storages.of(p) for p in layer.parameters())
                          for q, layer in enumerate(self.stack.layers)}
        self.first_free = recorder.storages._next + 1
        recorder.event_marks = [] if below is not None else None
        events = (lambda: below.events_now()) if below is not None else (lambda: 0)
        with short_run(self.stack, self.marks, lambda: len(recorder.calls), events, sequence_nr):
            yield

    def assembled(self, recorder, groups, below, notes: list) -> tuple[tuple, tuple]:
        """(calls, groups) of the full trace; Retrace when the short run proved nothing."""
        if self.stack is None:
            return tuple(recorder.calls), tuple(groups)
        from opscan.trace.splice import find_units

        stack, n = self.stack, len(self.stack.layers)
        head = f"repeated layers: {stack.name(0)} .. {stack.name(n - 1)} ({n} x {type(stack.layers[0]).__name__})"
        try:
            units = find_units(recorder.calls, self.marks, stack)
            coder = Coder(recorder.calls, units, stack, self.marks, self.param_ids, self.fx_names)
            done = replicate(recorder.calls, groups, units, coder, self.first_free)
            if below is not None:
                below.replicate(done, recorder.event_marks, units, stack)
        except Refused as exc:
            raise Retrace(f"{head}: not replicated, {exc}; every layer traced") from None
        notes.append(f"{head}: layers 3 .. {n - 2} replicated from layer 2, after layers 1 and 2 ran alike "
                     "(--no-repeat traces every layer)")
        return done.calls, done.groups


def fx_names(graph, stack: Stack) -> dict[int, tuple[str, ...]]:
    """Full position -> the fx node names of that layer's calls, in graph order."""
    prefix = f"{stack.path}." if stack.path else ""
    found: dict[int, list[str]] = {q: [] for q in range(len(stack.layers))}
    for node in graph.nodes:
        path = node.target if node.op == "call_module" else _scope(node) if node.op in (
            "call_function", "call_method") else None
        if isinstance(path, str) and path.startswith(prefix):
            head = path[len(prefix):].split(".", 1)[0]
            if head.isdigit() and int(head) in found:
                found[int(head)].append(node.name)
    return {q: tuple(names) for q, names in found.items()}
