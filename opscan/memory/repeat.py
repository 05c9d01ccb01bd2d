"""Memory stage: the storage events of a short run (trace/repeat.py) made into a full run's.

The tracker's events (a block allocated or freed, in order) fall into the same units as the calls: a unit's
events are those recorded from its first call to the next unit's. Within a unit a block is written relative
to its layer — a block the layer made first (by its place among the layer's), a parameter of a layer (by its
place in the layer) — with its size, dtype, device, role and call relative to the unit; anything else as it
is. Layers 1 and 2 must give equal events; layer 2's, decoded at positions 3 .. N-2, go where their calls go,
and every real unit is decoded again at its full position. Events outside the units that free a middle
layer's blocks (zero_grad setting gradients to None) come in runs, layer 1's then layer 2's: the copies follow
layer 2's run. Blocks are numbered afresh in the order they are allocated.
"""

from __future__ import annotations

from opscan.trace.splice import Refused, pairs


def replicate_events(tracker, assembled, event_marks: list[int], units, param_blocks: dict[int, tuple[int, ...]],
              runs: tuple[int, ...]) -> None:
    """Rewrite tracker's blocks, events and roles as a full run's (see the module docstring)."""
    total = len(tracker._events)
    marks = [*event_marks, total]
    new_of = {item: n for n, item in enumerate(assembled.order)}
    spans = []  # (k, event range, call range)
    for k, unit in [*enumerate(units.fwd), *enumerate(units.bwd), *units.opt]:
        spans.append((k, range(marks[unit.start], marks[unit.stop]), unit))
    owner = [None] * total
    for k, events, unit in spans:
        for e in events:
            owner[e] = (k, unit)
    code = _Codes(tracker, owner, param_blocks, runs)
    copies: dict[int, list] = {}
    for before, positions, unit in assembled.inserts:
        copies.setdefault(marks[before], []).append((positions, unit))
    for u1, u2, _ in pairs(units):
        a = [code.event(e, 1, u1) for e in range(marks[u1.start], marks[u1.stop])]
        b = [code.event(e, 2, u2) for e in range(marks[u2.start], marks[u2.stop])]
        if a != b:
            raise Refused("layers 1 and 2 allocated or freed memory differently")
    out = _global_runs(_spliced(code, owner, copies, marks, runs, total), runs)
    _rebuild(tracker, out, code, new_of, runs)


def _spliced(code, owner, copies, marks, runs, total: int) -> list:
    """Every event coded, with layer 2's copies where their calls go: (code, full position or None, unit)."""
    out: list[tuple] = []  # (block code or global block, sign, full position)
    for e in range(total + 1):
        for positions, unit in copies.get(e, ()):
            for fp in positions:
                out.extend((code.event(x, 2, unit), fp, unit) for x in range(marks[unit.start], marks[unit.stop]))
        if e == total:
            break
        where = owner[e]
        if where is None:
            out.append((code.event(e, None, None), None, None))
        else:
            k, unit = where
            out.append((code.event(e, k, unit), runs[k], unit))
    return out


class _Codes:
    def __init__(self, tracker, owner, param_blocks, runs):
        self.blocks, self.events, self.roles = tracker._blocks, tracker._events, tracker._roles
        self.where: dict[int, tuple] = {}
        for k, q in enumerate(runs):
            for i, b in enumerate(param_blocks[q]):
                self.where.setdefault(b, ("P", k, i))
        self.param_blocks = param_blocks
        counts = [0] * 4
        for e, value in enumerate(self.events):
            if value > 0 and owner[e] is not None and (value - 1) not in self.where:
                k = owner[e][0]
                self.where[value - 1] = ("F", k, counts[k])
                counts[k] += 1
        self.fresh = {k: [b for b, w in self.where.items() if w[:2] == ("F", k)] for k in range(4)}

    def event(self, e: int, k, unit) -> tuple:
        value = self.events[e]
        block = abs(value) - 1
        where = self.where.get(block)
        sign = 1 if value > 0 else -1
        if where is None or k is None:
            return ("G", block, sign, where)
        nbytes, dtype, device, clock = self.blocks[block]
        rel = clock - unit.start if value > 0 and where[0] == "F" and where[1] == k else None
        return (where[0], where[1] - k, where[2], sign, nbytes, dtype, device, self.roles.get(block, ""), rel)


def _global_runs(out: list, runs) -> list:
    """Copies of the runs of events outside the units that touch layer 2's blocks: after layer 2's run when layer
    1's came just before it (ascending, as zero_grad frees gradients), before it when layer 1's comes just after
    (descending, as a list of per-layer tensors is freed, last first)."""
    groups: list[tuple] = []  # (middle layer 1 or 2, or None; items)
    for item in out:
        where = item[0][3] if item[0][0] == "G" else None
        k = where[1] if where is not None and where[0] == "F" and where[1] in (1, 2) else None
        if k is not None and groups and groups[-1][0] == k:
            groups[-1][1].append(item)
        else:
            groups.append((k, [item]))
    result: list = []
    for g, (k, items) in enumerate(groups):
        if k != 2:
            result.extend(items)
            continue
        before = groups[g - 1] if g else (None, [])
        after = groups[g + 1] if g + 1 < len(groups) else (None, [])
        shifted = [_shifted(c, -1) for c, _, _ in items]
        copies = lambda positions: [(("O", c[3][0], c[3][2], c[2]), fp, None)  # noqa: E731
                                    for fp in positions for c, _, _ in items]
        if before[0] == 1 and shifted == [_plain(c) for c, _, _ in before[1]]:
            result.extend(items + copies(range(3, runs[3])))
        elif after[0] == 1 and shifted == [_plain(c) for c, _, _ in after[1]]:
            result.extend(copies(range(runs[3] - 1, 2, -1)) + items)
        else:
            raise Refused("memory freed outside the layers does not repeat from layer 1 to layer 2")
    return result


def _plain(code):
    return ("G", code[2], code[3])


def _shifted(code, by: int):
    where = code[3]
    return ("G", code[2], (where[0], where[1] + by, where[2]))


def _rebuild(tracker, out: list, code: _Codes, new_of, runs) -> None:
    blocks: list[list] = []
    events: list[int] = []
    roles: dict[int, str] = {}
    index: dict = {}  # (full position or None, block key) -> new block index

    def block_of(key, make):
        found = index.get(key)
        if found is None:
            found = index[key] = len(blocks)
            nbytes, dtype, device, clock, role = make()
            blocks.append([nbytes, dtype, device, clock])
            if role:
                roles[found] = role
        return found

    for c, fp, unit in out:
        key, sign, make = _resolve(c, fp, unit, code, new_of, runs)
        if make is None and key not in index:
            raise Refused("a replicated layer's memory is freed before it is made")
        b = block_of(key, make)
        events.append(sign * (b + 1))
    tracker._blocks, tracker._events, tracker._roles = blocks, events, roles


def _resolve(c, fp, unit, code: _Codes, new_of, runs):
    if c[0] == "G":
        block = c[1]
        return ("real", block), c[2], lambda: _real(code, block, new_of)
    if c[0] == "O":  # a copy of a global event of layer 2's block, at position fp
        kind, local, sign = c[1], c[2], c[3]
        return _block_key(kind, fp, local, code, runs), sign, None
    kind, off, local, sign, nbytes, dtype, device, role, rel = c
    key = _block_key(kind, fp + off, local, code, runs)
    if key[0] == "real":
        block = key[1]
        return key, sign, lambda: _real(code, block, new_of)
    clock = new_of.get((unit.start + rel, fp), -1) if rel is not None else -1
    return key, sign, lambda: (nbytes, dtype, device, clock, role)


def _block_key(kind, q: int, local: int, code: _Codes, runs):
    if kind == "P":
        return ("real", code.param_blocks[q][local])
    if q in runs:
        return ("real", code.fresh[runs.index(q)][local])
    return ("copy", q, local)


def _real(code: _Codes, block: int, new_of):
    nbytes, dtype, device, clock = code.blocks[block]
    moved = new_of.get((clock, None), clock) if clock >= 0 else clock
    return nbytes, dtype, device, moved, code.roles.get(block, "")
