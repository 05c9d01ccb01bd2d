"""Predict stage: the MPS view for the predicted-for release R where R's C++ composites call other ops than the
tracing torch's (rule `release-callees`).

The step is traced with the installed torch I, so a composite the trace ran — a CompositeExplicitAutograd op the
recorder expanded (`composite-callee` rows), or a CompositeImplicitAutograd op the lens kept as a span (lens.py) —
dispatched I's callees. composite_callees.txt (knowledge stage; read from every release's macOS libtorch_cpu.dylib)
says what each release's kernel calls. Where R's set differs from I's, the composite's calls are judged by R's:
- a traced call (with what it dispatched) is dropped when every direct callee of I's kernel it comes from is one
  R's kernel does not call (a call that is itself a callee, or that a composite callee of I dispatches);
- when a call was dropped, each op R's kernel calls and I's does not is added, with the composite's inputs (its
  dtypes), rule
  `release-callees`, judged by R's knowledge base (a composite callee without an MPS kernel by its OpInfo samples,
  as `opscan coverage` judges it, with how its own kernel differs in R said beside): the binary is the evidence;
- when every traced call was dropped (I took a branch R's kernel does not have), every op R's kernel calls is added;
- when no call was dropped, the step's path is in R's kernel too, and the ops only R's kernel calls sit on branches
  the run did not take (the sparse and quantized paths of `_to_copy`...): the notes name them, unjudged;
- a composite that R runs as an op of its own (declared, not composite) becomes that one call.
The table's sets are static (any branch), so an added op may sit on a branch the step does not take: the evidence
says so. Backward calls of a dropped callee stay (R's backward is judged by the backward ops the trace saw).
Where R's (or I's) callees are not known, the composite's calls keep I's path and their evidence says so
(`release-callees-unknown`). The trace itself never depends on R: this runs after it, per release.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from opscan.knowledge import Knowledge
from opscan.knowledge.composite_callees import CALLEES_SOURCE, load_callees
from opscan.mps_view import MpsCall
from opscan.opkey import OpKey, Release
from opscan.verdict import Classification, Evidence

RULE, UNKNOWN_RULE = "release-callees", "release-callees-unknown"
# Composites that return a real input as it is, dispatching nothing (UnaryOps.cpp: `conj_physical`, `conj_physical_`:
# `if (!self.is_complex()) return self;`; `resolve_conj`: `if (!self.is_conj()) return self;` — only complex
# tensors carry the conj bit): a release's kernel that "calls" one sits on its complex branch for a real step.
REAL_NOOPS = frozenset({"conj_physical", "conj_physical_", "resolve_conj", "conj"})
_COMPLEX_DTYPES = ("complex32", "complex64", "complex128")
CLOSURE_DEPTH = 3  # how deep a composite callee's own callees are followed to attribute a traced call


def span_ops() -> frozenset[str]:
    """The CompositeImplicitAutograd ops whose kernel differs between covered releases (the lens's span ops)."""
    table = load_callees()
    return frozenset() if table is None else _span_ops(table)


@functools.lru_cache(maxsize=4)
def _span_ops(table) -> frozenset[str]:
    """span_ops() of one table, made once per table (a CalleeTable hashes by identity): every trace asks, and the
    walk over every release's kernels costs more than a small step's trace records."""
    drifted = table.drifted()
    return frozenset(op for op in drifted if any(t.get(op) and t[op].key == "CIA" for t in table.kernels.values()))


@dataclass(frozen=True)
class _Node:
    """A composite the trace ran: its op (yaml name), the trace index it starts at, and its units — the direct
    calls and nested spans under it, each (op yaml name, first index, trace indices it covers)."""

    op: str
    first: int
    covers: frozenset[int]
    units: tuple[tuple[str, int, frozenset[int]], ...]


def release_view(trace, view: tuple[MpsCall, ...], kb: Knowledge) -> tuple[tuple[MpsCall, ...], tuple[str, ...]]:
    """(the view as R = kb.release runs its composites, notes for the report); the view itself when R is the
    tracing torch's release or nothing differs."""
    installed = Release.drop_local(trace.torch_version)
    table = load_callees()
    if installed == kb.release or table is None:
        return view, ()
    if not table.covers(installed) or not table.covers(kb.release):
        missing = installed if not table.covers(installed) else kb.release
        return view, (f"{RULE}: composite_callees.txt does not cover torch {missing}, so the composites the trace "
                      f"ran keep the installed torch {trace.torch_version}'s C++ paths (not checked against torch "
                      f"{kb.release}'s)",)
    plan = _Plan(trace, kb, table, installed)
    for node in _nodes(trace):
        plan.visit(node)
    return plan.apply(view), plan.notes()


def _nodes(trace) -> list[_Node]:
    """Every composite the trace ran (expanded calls and span groups), outermost first."""
    children: dict[int, list[int]] = {}
    for call in trace.calls:
        if call.parent is not None:
            children.setdefault(call.parent, []).append(call.index)
    spans = sorted((g for g in trace.groups if g.mode == "span"), key=lambda g: (g.start, -g.end))
    found = []
    for call in trace.calls:
        if call.expanded and call.index in children:
            covers = _below(children, call.index)
            inside = range(call.index, max(covers) + 1)
            found.append(_Node(call.op.yaml_name, call.index, covers,
                               _units(trace, spans, children, children[call.index], inside)))
    for g in spans:
        calls = trace.calls[g.start:g.end]
        direct = [c.index for c in calls if (c.parent is None or c.parent < g.start) and not c.bookkeeping]
        inside = range(g.start, g.end)
        found.append(_Node(g.forward.yaml_name, g.start, frozenset(inside),
                           _units(trace, spans, children, direct, inside)))
    return sorted(found, key=lambda n: (n.first, -len(n.covers)))


def _below(children: dict[int, list[int]], index: int) -> frozenset[int]:
    """A call and every call it dispatched, however deep."""
    out, todo = {index}, [index]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.add(child)
            todo.append(child)
    return frozenset(out)


def _units(trace, spans, children, direct: list[int], inside: range) -> tuple:
    """The units of a composite covering `inside`: its `direct` calls, those inside a span nested in it taken
    together as that span (the outermost one)."""
    nested = [g for g in spans if inside.start <= g.start and g.end <= inside.stop
              and (g.start, g.end) != (inside.start, inside.stop)]
    out, taken = [], set()
    for i in direct:
        span = next((g for g in nested if g.start <= i < g.end), None)
        if span is None:
            out.append((trace.calls[i].op.yaml_name, i, _below(children, i)))
        elif id(span) not in taken:
            taken.add(id(span))
            out.append((span.forward.yaml_name, span.start, frozenset(range(span.start, span.end))))
    return tuple(out)


class _Plan:
    """What release_view does to the view: trace indices dropped, calls added (by anchor index), notes."""

    def __init__(self, trace, kb: Knowledge, table, installed: str):
        self.trace, self.kb, self.table, self.installed = trace, kb, table, installed
        self.dropped: set[int] = set()
        self.added: dict[int, list[tuple[str, OpKey]]] = {}  # anchor index -> (composite, op added)
        self.unknown: dict[int, str] = {}  # trace index -> the composite whose R path is not known
        self.changed: dict[str, str] = {}  # composite -> how R's kernel differs (for the notes)
        self.unjudged: dict[str, set[str]] = {}  # composite -> ops only R's kernel calls, on a path not taken

    def visit(self, node: _Node) -> None:
        if node.first in self.dropped:
            return
        mine, theirs = (self.table.kernel(node.op, r) for r in (self.installed, self.kb.release))
        if theirs is None and self.kb.yaml.get(OpKey.from_yaml(node.op)) is not None:
            self._own_kernel(node)
        elif mine is None or mine.callees is None or theirs is None or theirs.callees is None:
            if mine != theirs:
                self.unknown.update(dict.fromkeys(node.covers, node.op))
        elif mine.callees != theirs.callees:
            self._delta(node, mine.callees, theirs.callees)

    def _own_kernel(self, node: _Node) -> None:
        """R declares the op with a kernel of its own: it runs that, not I's decomposition."""
        self.dropped.update(i for _, _, covers in node.units for i in covers)
        self.added.setdefault(node.first, []).append((node.op, OpKey.from_yaml(node.op)))
        self.changed[node.op] = f"an op of its own in torch {self.kb.release} (not a composite)"

    def _delta(self, node: _Node, mine: frozenset[str], theirs: frozenset[str]) -> None:
        kept = []
        for op, _, covers in node.units:
            sources = self._attributed(op, mine)
            if sources and not sources & theirs:
                self.dropped.update(covers)
            else:
                kept.append(sources)
        removed, plus = sorted(mine - theirs), sorted(theirs - mine)
        if len(kept) == len(node.units):  # the step's path is all in R's kernel too: R's other calls sit on
            if plus:  # branches the installed torch's run did not take (or R's own extra ones): said, not judged
                self.unjudged.setdefault(node.op, set()).update(plus)
            return
        new = theirs - mine if kept else theirs  # nothing kept: I took a branch R's kernel lacks
        if not any(d in _COMPLEX_DTYPES for d in self.trace.calls[node.first].dtypes):
            noops = new & REAL_NOOPS  # the complex branch of R's kernel: for real input they return it as is
            if noops:
                self.unjudged.setdefault(node.op, set()).update(noops)
                new = new - noops
        self.added.setdefault(node.first, []).extend((node.op, OpKey.from_yaml(op)) for op in sorted(new))
        self.changed[node.op] = " ".join([*(f"-{op}" for op in removed), *(f"+{op}" for op in plus)])

    def _attributed(self, op: str, mine: frozenset[str]) -> frozenset[str]:
        """The direct callees of I's kernel a traced call may come from: itself, and the composite callees that can
        dispatch it (empty: none found)."""
        return frozenset(x for x in mine if x == op or op in _closure(self.table, self.installed, x, CLOSURE_DEPTH))

    def apply(self, view: tuple[MpsCall, ...]) -> tuple[MpsCall, ...]:
        """The view with the dropped calls out, the added ones in at their composite's place."""
        pending = sorted(self.added.items())
        out: list[MpsCall] = []
        for call in view:
            while pending and pending[0][0] <= call.index:
                out.extend(self._made(*pending.pop(0)))
            if call.index in self.dropped:
                continue
            composite = self.unknown.get(call.index)
            if composite is not None:
                call = replace(call, rule=UNKNOWN_RULE, cpu_op=call.cpu_op or OpKey.from_yaml(composite))
            out.append(call)
        for anchor, ops in pending:
            out.extend(self._made(anchor, ops))
        return tuple(out) if self.added or self.dropped or self.unknown else view

    def _made(self, anchor: int, ops) -> list[MpsCall]:
        base = self.trace.calls[anchor]
        dtypes = tuple(dict.fromkeys(base.dtypes))  # the composite's input dtypes, each once (arity is not known)
        return [MpsCall(index=anchor, op=op, phase=base.phase, module=base.module, inputs=base.inputs,
                        outputs=base.outputs, dtypes=dtypes, cpu_op=OpKey.from_yaml(composite), rule=RULE)
                for composite, op in ops]

    def notes(self) -> tuple[str, ...]:
        out = []
        if self.changed:
            what = "; ".join(f"{op}: {how}" for op, how in sorted(self.changed.items()))
            out.append(f"{RULE}: torch {self.kb.release}'s C++ composites call other ops than the installed torch "
                       f"{self.installed}'s (read from its macOS libtorch_cpu.dylib), and their rows are judged by "
                       f"{self.kb.release}'s: {what}")
        if self.unjudged:
            what = "; ".join(f"{op}: {' '.join(sorted(ops))}" for op, ops in sorted(self.unjudged.items()))
            out.append(f"{RULE}: torch {self.kb.release}'s kernels of these composites can also call ops the "
                       f"installed torch's do not, on branches this step's run did not take (every call it made is "
                       f"one {self.kb.release}'s kernel makes too), so they are not judged: {what}")
        for op in sorted(set(self.unknown.values())):
            declared = self.kb.yaml.get(OpKey.from_yaml(op)) is not None
            why = ("composite_callees.txt has no kernel body for it" if declared else
                   f"torch {self.kb.release} does not declare it: the step's code calls an op that release lacks")
            out.append(f"{UNKNOWN_RULE}: what torch {self.kb.release}'s C++ kernel of {op} calls is not known "
                       f"({why}); its rows keep the installed torch {self.installed}'s path")
        return tuple(out)


@functools.lru_cache(maxsize=4096)
def _closure(table, release: str, op: str, depth: int) -> frozenset[str]:
    """Every op `op`'s kernel in `release` can reach through composite callees, `depth` levels deep."""
    kernel = table.kernel(op, release)
    if kernel is None or kernel.callees is None or depth == 0:
        return frozenset()
    out = set(kernel.callees)
    for callee in kernel.callees:
        out |= _closure(table, release, callee, depth - 1)
    return frozenset(out)


def judge_added(call: MpsCall, kb: Knowledge) -> Classification:
    """The verdict of an op added by `release-callees`: the op judged in kb's release, with the binary as evidence."""
    found = _judge(call.op, call.dtypes, kb)
    installed = kb.installed_release or "installed"
    if call.op == call.cpu_op:
        how = (f"torch {kb.release} declares {call.op} with a kernel of its own, so it runs it where the installed "
               f"torch {installed} ran a decomposition")
    else:
        how = (f"torch {kb.release}'s C++ kernel of {call.cpu_op} calls {call.op}, which the installed torch "
               f"{installed}'s does not (read from {kb.release}'s macOS libtorch_cpu.dylib: a static set, so the "
               f"call may sit on a branch this step does not take)")
    text = f"{how}; {call.op}: {found.evidence.text}"
    source = " + ".join(dict.fromkeys((CALLEES_SOURCE.format(release=kb.release), found.evidence.source)))
    return Classification(found.verdict, Evidence(RULE, text, source), found.remedy, found.since)


def judge_unknown(found: Classification, call: MpsCall, kb: Knowledge) -> Classification:
    """A call of a composite whose kernel in kb's release is not known: its verdict, saying so."""
    text = (f"{found.evidence.text}; the installed torch's kernel of {call.cpu_op} dispatched it, and what torch "
            f"{kb.release}'s calls is not known (composite_callees.txt), so this is the installed torch's path")
    return Classification(found.verdict, Evidence(found.evidence.rule, text, found.evidence.source), found.remedy,
                          found.since)


def _judge(op: OpKey, dtypes: tuple[str, ...], kb: Knowledge) -> Classification:
    """An added op in kb's release; a composite without an MPS kernel by what the knowledge base knows it calls
    after the dtype layer (predict/composite.py judge_op: the table's static sets list every branch, sparse and
    quantized ones included, too many to judge a call by), with what its own kernel does differently in that
    release said beside it."""
    from opscan.predict.rules import judge_composite, predict_op

    entry = kb.yaml.get(op)
    if entry is None or not entry.composite or kb.yaml.mps_kernel(op) is not None or op in kb.facts.device_branches:
        return predict_op(op, dtypes, kb)
    found = judge_composite(op, dtypes, kb)
    table = load_callees()
    theirs = table.kernel(op.yaml_name, kb.release) if table else None
    mine = table.kernel(op.yaml_name, kb.installed_release) if table and kb.installed_release else None
    if mine is None or theirs is None or mine.callees is None or theirs.callees is None or mine == theirs:
        return found
    delta = " ".join([*(f"-{c}" for c in sorted(mine.callees - theirs.callees)),
                      *(f"+{c}" for c in sorted(theirs.callees - mine.callees))])
    text = (f"{found.evidence.text} (its own kernel in torch {kb.release} differs from the installed torch's on "
            f"some branch: {delta})")
    return Classification(found.verdict, Evidence(found.evidence.rule, text, found.evidence.source), found.remedy,
                          found.since)
