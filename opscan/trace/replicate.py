"""Trace stage: the full trace assembled from a short run (repeat.py) — the proof, the copies, the numbering.

`replicate(...)` checks that layers 1 and 2 gave equal units and that nothing outside the layers touched
theirs (else `Refused`), inserts layer 2's units decoded at positions 3 .. N-2 where a full run makes them
(forward: before layer N-1's; backward: before layer 2's, last layer first; each optimizer loop: before
layer N-1's parameters), re-decodes every real unit at its full position, moves the lens groups with their
calls, and numbers the storages as a full trace meets them (`renumber`). `Assembled.order` says, per call of
the full trace, which short-run call it is and at which position (None: the call itself), for the memory
events (opscan/memory/tracker.py `replicate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opscan.trace.records import OpCall
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
    order = _order(len(calls), inserts)
    new_of = {item: n for n, item in enumerate(order)}
    out = []
    codes = {}
    for n, (i, fp) in enumerate(order):
        c = calls[i]
        if fp is None and i not in where:
            out.append(_moved(c, n, new_of, coder))
            continue
        k, unit = (2, where[i][1]) if fp is not None else where[i]
        code = codes.get(i) or codes.setdefault(i, coder.call(c, k, unit))
        at = coder.full(k) if fp is None else fp
        out.append(coder.decode(code, at, n, _parents(new_of, unit, fp)))
    return Assembled(renumber(out, first_free), _groups(groups, where, units, coder, new_of, inserts, len(order)),
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


def _order(count: int, inserts) -> list[tuple[int, int | None]]:
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


def _moved(c: OpCall, n: int, new_of, coder: Coder) -> OpCall:
    parent = None if c.parent is None else new_of[(c.parent, None)]
    node = coder.unnode(("G", c.node), 0)
    if n == c.index and parent == c.parent and node == c.node:
        return c
    return replace(c, index=n, parent=parent, node=node)


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


def renumber(calls: list[OpCall], first_free: int) -> tuple[OpCall, ...]:
    """Storage ids numbered as the recorder meets them in a full run: ids below `first_free` (given before
    the step: parameters, buffers, inputs) kept; every other id by first sight — a call's inputs, then its
    composite callees, then its outputs."""
    ids: dict[int, int] = {}
    nxt = [first_free]

    def number(t):
        s = t.storage
        if s < first_free:
            return t
        found = ids.get(s)
        if found is None:
            found = ids[s] = nxt[0]
            nxt[0] += 1
        return t if found == s else replace(t, storage=found)

    out: list = [None] * len(calls)
    open_: list[int] = []
    for pos, c in enumerate(calls):
        while open_ and open_[-1] != c.parent:
            _close(out, calls, open_.pop(), number)
        out[pos] = tuple(number(t) for t in c.inputs)
        if c.expanded and pos + 1 < len(calls) and calls[pos + 1].parent == c.index:
            open_.append(pos)
        else:
            _close(out, calls, pos, number)
    while open_:
        _close(out, calls, open_.pop(), number)
    return tuple(out)


def _close(out: list, calls, pos: int, number) -> None:
    c = calls[pos]
    inputs = out[pos]
    outputs = tuple(number(t) for t in c.outputs)
    same = all(a is b for a, b in zip(inputs, c.inputs)) and all(a is b for a, b in zip(outputs, c.outputs))
    out[pos] = c if same else replace(c, inputs=inputs, outputs=outputs)
