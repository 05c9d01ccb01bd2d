"""Memory stage: repeated layers in the sizing runs (batch.py), as in the trace (trace/repeat.py).

A sizing run of a model whose stack is proven alike before the step runs layers 0, 1, 2 and N-1 only; the
tracker marks each call with its events so far and the autograd node it runs, which places every backward
call in its layer (the sequence numbers each layer's forward consumed; a gradient's accumulation by its
parameter). Layer 2's events then stand for layers 3 .. N-2 (repeat.py `replicate_events`, which also proves
layers 1 and 2 alike); when they are not, the run is made again with every layer (`Refused`).
"""

from __future__ import annotations

import contextlib

import torch

from opscan.trace.repeat import Marks, find_stack, sequence_nr, short_run
from opscan.trace.replicate import Assembled, order_of
from opscan.trace.splice import Refused, Units, check_marks

_NO_NODE = 1 << 63


class ShortSizing:
    """The repeated-layers shortcut of one sizing run."""

    def __init__(self, stack):
        self.stack = stack
        self.marks = Marks()
        self.calls: list = []  # per call: (events before it, its autograd node's sequence number or parameter)

    @classmethod
    def of(cls, model, wanted: bool) -> ShortSizing | None:
        """The shortcut for `model` when wanted and a stack of it is proven alike, else None."""
        stack = find_stack(model)[0] if wanted else None
        return cls(stack) if stack is not None else None

    @contextlib.contextmanager
    def running(self, tracker):
        """While the sizing step runs: layers 0, 1, 2 and N-1 only, each call marked."""
        tracker.call_marks = self.calls
        try:
            with short_run(self.stack, self.marks, lambda: tracker.calls, tracker.events_now, sequence_nr):
                yield
        finally:
            tracker.call_marks = None

    def replicate(self, tracker) -> None:
        """The tracker's events as a full run's, or Refused."""
        units = self._units()
        middle = tuple(range(3, len(self.stack.layers) - 1))
        inserts = [(units.fwd[3].start, middle, units.fwd[2])]
        if units.bwd:
            inserts.append((units.bwd[2].start, tuple(reversed(middle)), units.bwd[2]))
        order = order_of(len(self.calls), inserts)
        tracker.replicate(Assembled((), (), tuple(order), tuple(inserts)), [e for e, _ in self.calls], units,
                          self.stack)

    def _units(self) -> Units:
        marks = self.marks
        check_marks(marks)
        fwd = tuple(range(marks.calls[k], marks.calls[k + 1]) for k in range(4))
        owners = self._owners()
        firsts = [owners.index(k) if k in owners else None for k in range(4)]
        bwd: tuple[range, ...] = ()
        if any(f is not None for f in firsts):
            if None in firsts or not firsts[3] < firsts[2] < firsts[1] < firsts[0]:
                raise Refused("the layers' backward did not run once each, last layer first")
            end0 = next((i for i in range(firsts[0], len(owners)) if owners[i] != 0), len(owners))
            bwd = (range(firsts[0], end0), range(firsts[1], firsts[0]), range(firsts[2], firsts[1]),
                   range(firsts[3], firsts[2]))
        owner: list = [None] * len(owners)
        for k, unit in [*enumerate(fwd), *enumerate(bwd)]:
            for i in unit:
                owner[i] = k
        if any(k is not None and owner[i] != k for i, k in enumerate(owners)):
            raise Refused("a layer's backward ran outside its turn")
        return Units(fwd, bwd, (), tuple(owner))

    def _owners(self) -> list:
        """Per call, the running layer (0..3) whose backward it is, else None."""
        seqs = self.marks.seqs
        params = {id(p): k for k, q in enumerate(self.stack.runs) for p in self.stack.layers[q].parameters()}
        out: list = []
        for _, node in self.calls:
            if node is None:
                out.append(None)
            elif type(node) is tuple:
                out.append(params.get(node[1]))
            elif seqs[0] <= node < seqs[4]:
                out.append(next(k for k in range(4) if node < seqs[k + 1]))
            else:
                out.append(None)
        return out


def node_mark():
    """The autograd node a call runs: its sequence number, ("parameter", id) for a gradient's accumulation, or
    None outside backward."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    seq = node._sequence_nr()
    return ("parameter", id(node.variable)) if seq >= _NO_NODE else seq
