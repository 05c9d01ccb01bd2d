"""Trace stage: the calls of a short run (repeat.py: layers 0, 1, 2 and N-1) made into a full trace's calls.

The calls of each running layer fall into units: its forward (from its start to the next layer's), its
backward (from its first backward call to the next layer's) and, per optimizer loop, the run of calls on its
parameters. Within a unit every storage, autograd node, module path, fx node and parent is written relative
to the layer (`Coder`): a storage the unit's layer (or its neighbour) made first, a parameter of a layer by
its place in the layer, a node by its place among the sequence numbers the layer's forward consumed; anything
else as it is. Layers 1 and 2 must give equal units (the proof: `Refused` says what differed). Layer 2's
units, decoded at positions 3 .. N-2, are the replicated layers; every real unit is decoded again at its full
position (layer N-1's neighbour is layer N-2 now). Storage ids are then numbered afresh in the order a full
trace meets them (`renumber`), and autograd sequence numbers after the stack move by the replicated layers'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opscan.trace.records import OpCall, TensorMeta

TEMP = 1 << 48  # storage ids of replicated layers before renumbering
# the OpCall fields a unit's code writes relative to its layer (Coder.call); every other field is carried as it is
RELATIVE = ("module", "inputs", "outputs", "fx_node", "node", "parent")
_STRIDE = 1 << 24
_NO_NODE = 1 << 63  # AccumulateGrad's sequence number (UINT64_MAX) and above: not the layers'


class Refused(Exception):
    """The short run does not prove the layers repeat; the message says why (the step is traced in full)."""


@dataclass(frozen=True)
class Units:
    """Call ranges of the running layers k = 0..3: forward, backward and optimizer units; `pairs`: each
    optimizer loop's (layer 1, layer 2) units; `insert`: short-run index -> (fp, unit) copies go before it."""

    fwd: tuple[range, ...]
    bwd: tuple[range, ...]
    opt: tuple[tuple[int, range], ...]
    owner: tuple  # per call: k of its unit, or None


def find_units(calls, marks, stack) -> Units:
    """The units of the short run, or Refused."""
    check_marks(marks)
    layer_of = _layer_of(stack)
    fwd = tuple(range(marks.calls[k], marks.calls[k + 1]) for k in range(4))
    firsts = [next((c.index for c in calls if c.phase == "backward" and layer_of(c.module) == k), None)
              for k in range(4)]
    bwd: tuple[range, ...] = ()
    if any(f is not None for f in firsts):
        if None in firsts or not firsts[3] < firsts[2] < firsts[1] < firsts[0]:
            raise Refused("the layers' backward did not run once each, last layer first")
        end0 = next((c.index for c in calls[firsts[0]:] if c.module and layer_of(c.module) != 0), len(calls))
        bwd = (range(firsts[0], end0), range(firsts[1], firsts[0]), range(firsts[2], firsts[1]),
               range(firsts[3], firsts[2]))
    opt = tuple(_optimizer_units(calls, layer_of))
    owner: list = [None] * len(calls)
    for k, unit in [*enumerate(fwd), *enumerate(bwd), *opt]:
        for i in unit:
            owner[i] = k
    stray = next((c for c in calls if layer_of(c.module) is not None and owner[c.index] != layer_of(c.module)), None)
    if stray is not None:
        raise Refused(f"a {stray.phase} call of {stray.module} ({stray.op.display}) fell outside the layer's units")
    return Units(fwd, bwd, opt, tuple(owner))


def check_marks(marks) -> None:
    """Refused unless each running layer ran once and none read its index (repeat.py _Watched)."""
    if marks.entered != 4 or len(marks.calls) != 5:
        raise Refused(f"the stack's layers ran {marks.entered} times, not once each")
    if marks.index_reads:
        raise Refused(f"a layer's code reads its index: {marks.index_reads[0]}")


def _optimizer_units(calls, layer_of):
    current, start = None, 0
    for c in calls:
        if c.phase != "optimizer" or not c.module:
            if c.phase != "optimizer" and current is not None:
                yield current, range(start, c.index)
                current = None
            continue
        k = layer_of(c.module)
        if k == current:
            continue
        if current is not None:
            yield current, range(start, c.index)
        current, start = k, c.index
    if current is not None:
        yield current, range(start, len(calls))


def _layer_of(stack):
    prefix = f"{stack.path}." if stack.path else ""
    runs = {str(p): k for k, p in enumerate(stack.runs)}
    cache: dict[str, int | None] = {}

    def layer_of(module: str) -> int | None:
        found = cache.get(module, -1)
        if found == -1:
            rest = module[len(prefix):] if module.startswith(prefix) else None
            found = cache[module] = None if rest is None else runs.get(rest.split(".", 1)[0])
        return found
    return layer_of


def pairs(units: Units) -> list[tuple[range, range, range]]:
    """(layer 1's unit, layer 2's unit, where copies go: before layer N-1's) for every kind of unit."""
    out = [(units.fwd[1], units.fwd[2], units.fwd[3])]
    if units.bwd:
        out.append((units.bwd[1], units.bwd[2], units.bwd[2]))  # backward: copies before layer 2's
    opt = list(units.opt)
    for i, (k, unit) in enumerate(opt):
        if k != 2:
            continue
        before, after = opt[i - 1] if i else (None, None), opt[i + 1] if i + 1 < len(opt) else (None, None)
        if before[0] != 1 or after[0] != 3 or before[1].stop != unit.start or unit.stop != after[1].start:
            raise Refused("the optimizer did not visit the layers' parameters in order, one layer after another")
        out.append((before[1], unit, after[1]))
    return out


class Coder:
    """Writes the calls of a unit relative to its layer, and reads them back at any position."""

    def __init__(self, calls, units: Units, stack, marks, param_ids, fx_names):
        self.stack, self.n = stack, len(stack.layers)
        self.layer_of = _layer_of(stack)
        self.seqs = marks.seqs
        self.kseq = marks.seqs[3] - marks.seqs[2]
        self.params = param_ids  # full position -> storage ids of its parameters
        self.fx = fx_names  # full position -> its fx node names, in graph order
        self.fx_at = {name: (q, i) for q, names in fx_names.items() for i, name in enumerate(names)}
        self.ids: dict[int, tuple] = {}
        for k, p in enumerate(stack.runs):
            for i, sid in enumerate(param_ids[p]):
                self.ids.setdefault(sid, ("P", k, i))
        counts = [0] * 4
        for c in calls:
            k = units.owner[c.index]
            for t in (*c.inputs, *c.outputs):
                if t.storage not in self.ids and t.storage >= 0:
                    if k is None:
                        self.ids[t.storage] = None
                    else:
                        self.ids[t.storage] = ("F", k, counts[k])
                        counts[k] += 1
        self.fresh = {k: [s for s, where in self.ids.items() if where and where[:2] == ("F", k)] for k in range(4)}

    def full(self, k: int) -> int:
        """The full position of running layer k."""
        return self.stack.runs[k]

    # encoding (relative to running layer k)
    def call(self, c: OpCall, k: int, unit: range) -> OpCall:
        """`c` coded relative to running layer k: its RELATIVE fields as codes, every other field as it is (a
        field OpCall gains is carried without a change here); index 0, so that two layers' codes compare."""
        parent = None if c.parent is None else (
            ("R", c.parent - unit.start) if c.parent in unit else ("G", c.parent))
        return replace(c, index=0, module=self._module(c.module, k), inputs=tuple(self._meta(t, k) for t in c.inputs),
                       outputs=tuple(self._meta(t, k) for t in c.outputs), fx_node=self._fx(c.fx_node, k),
                       node=self.node(c.node, k), parent=parent)

    def _meta(self, t: TensorMeta, k: int) -> tuple:
        where = self.ids.get(t.storage)
        sid = ("G", t.storage) if where is None else (where[0], where[1] - k, where[2])
        return (t, sid)

    def _module(self, module: str, k: int):
        q = self.layer_of(module)
        if q is None:
            return ("G", module)
        name = self.stack.name(self.full(q))
        return ("M", q - k, module[len(name):])

    def _fx(self, name, k: int):
        where = self.fx_at.get(name)
        if where is None:
            return ("G", name)
        q = self.stack.runs.index(where[0]) if where[0] in self.stack.runs else None
        return ("G", name) if q is None else ("X", q - k, where[1])

    def node(self, node, k: int):
        """An autograd sequence number, relative to running layer k when a running layer's forward made it."""
        if node is None or node >= _NO_NODE or not self.seqs[0] <= node < self.seqs[4]:
            return ("G", node)
        q = next(q for q in range(4) if node < self.seqs[q + 1])
        return ("N", q - k, node - self.seqs[q])

    def equal(self, a: OpCall, b: OpCall) -> bool:
        """Two coded calls alike: TensorMetas compared without their storage (which the codes stand for)."""
        if len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
            return False
        if replace(a, inputs=(), outputs=()) != replace(b, inputs=(), outputs=()):
            return False
        return all(_same(x, y) for x, y in zip((*a.inputs, *a.outputs), (*b.inputs, *b.outputs)))

    # decoding (at full position fp)
    def decode(self, code: OpCall, fp: int, parent_of) -> tuple[OpCall, list, list]:
        """(the call at full position fp with its index, inputs and outputs left for `renumber`-style assembly
        (replicate.py `Walker`), its inputs and its outputs as (TensorMeta, storage id))."""
        call = replace(code, module=self._unmodule(code.module, fp), inputs=(), outputs=(),
                       fx_node=self._unfx(code.fx_node, fp), node=self.unnode(code.node, fp),
                       parent=parent_of(code.parent))
        return call, [(t, self.sid(kind, off, rest, fp)) for t, (kind, off, *rest) in code.inputs], \
            [(t, self.sid(kind, off, rest, fp)) for t, (kind, off, *rest) in code.outputs]

    def sid(self, kind, off, rest, fp: int) -> int:
        """The storage id a code stands for at full position fp."""
        if kind == "G":
            return off
        q = fp + off
        if kind == "P":
            return self.params[q][rest[0]]
        if q in self.stack.runs:
            return self.fresh[self.stack.runs.index(q)][rest[0]]
        return TEMP + q * _STRIDE + rest[0]

    def _unmodule(self, code, fp: int) -> str:
        return code[1] if code[0] == "G" else self.stack.name(fp + code[1]) + code[2]

    def _unfx(self, code, fp: int):
        return code[1] if code[0] == "G" else self.fx[fp + code[1]][code[2]]

    def unnode(self, code, fp: int):
        """A sequence number back at full position fp (a number after the stack moves by the copies')."""
        if code[0] == "G":
            node = code[1]
            moved = node is not None and self.seqs[3] <= node < _NO_NODE
            return node + (self.n - 4) * self.kseq if moved else node
        q = fp + code[1]
        return self.seq_full(q) + code[2]

    def seq_full(self, q: int) -> int:
        """The sequence number layer q's forward began at in a full run."""
        if q <= 2:
            return self.seqs[q]
        if q == self.n - 1:
            return self.seqs[3] + (self.n - 4) * self.kseq
        return self.seqs[2] + (q - 2) * self.kseq


def _same(a, b) -> bool:
    (ta, ca), (tb, cb) = a, b
    return ca == cb and replace(ta, storage=0) == replace(tb, storage=0)
