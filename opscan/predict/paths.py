"""Predict stage: a composite whose callees the trace could not see, decided from its possible paths
(knowledge/composite_paths.yaml: one path per branch of its body in that release's C++ source).

The rule, for a composite C whose possible paths are P1..Pn (each the ops that branch always reaches):

* on a path, the worst callee decides (as for traced callees, rule `composite-callees`);
* when the call's recorded arguments meet one path's condition, that path is the one taken: its worst callee
  decides (rule `composite-path`);
* otherwise, if every path reaches a non-native callee (each path's worst is `cpu_fallback` or worse), C cannot be
  native whatever the branch, and the verdict is the least severe among the paths' worst callees: a lower bound
  the text states as "at least" (rule `composite-no-native-path`). A path whose worst is `unknown` or `native`
  could make C native: then nothing is decided here (C stays `unknown`, rule `composite-no-callees`).

A path that returns a sparse tensor is judged by predict/sparse.py as well (no SparseMPS kernel before 2.9.0).
No torch import.
"""

from __future__ import annotations

from collections.abc import Callable

from opscan.knowledge.composite_paths import CompositePaths, paths_for
from opscan.knowledge.conditions import evaluate_when
from opscan.opkey import OpKey
from opscan.predict.dtype_rules import result
from opscan.predict.sparse import predict_sparse
from opscan.verdict import Classification, Verdict

Judge = Callable[[OpKey, tuple[str, ...]], Classification]
_NOT_NATIVE = Verdict.CPU_FALLBACK.rank  # the least severe verdict that is surely not native


def decide_paths(c, judge: Judge) -> Classification | None:
    """The verdict of composite call `c` (predict.rules' call record) from its possible paths, or None."""
    entry = paths_for(c.op.yaml_name, c.release) if c.op.namespace == "aten" else None
    if entry is None:
        return None
    judged = [(path, _judge_path(path, c.kb, judge)) for path in entry.paths]
    taken = _taken(entry, c)
    kind = c.kb.yaml.get(c.op).composite
    head = f"{c.op} is {kind} in {c.kb.yaml_source}, and its callees were not traced"
    if taken is not None:
        path, pairs = next((p, j) for p, j in judged if p is taken)
        worst_op, worst = max(pairs, key=lambda pair: pair[1].verdict.rank)
        text = (f"{head}; its body takes the path `{path.when}` for this call, which calls {_named(pairs)}: "
                f"the worst, {worst_op}, decides for torch {c.release}")
        return _result(worst, "composite-path", text, entry)
    worsts = [max(pairs, key=lambda pair: pair[1].verdict.rank) for _, pairs in judged]
    if any(w.verdict.rank < _NOT_NATIVE for _, w in worsts):
        return None
    least_op, least = min(worsts, key=lambda pair: pair[1].verdict.rank)
    paths = "; ".join(f"`{p.when or 'always'}`: {_named(pairs)}" for p, pairs in judged)
    text = (f"{head}; every path of its body reaches a callee that is not native in torch {c.release} ({paths}), "
            f"so it is not native whichever path runs: at least {least.verdict} (the least severe of the paths' "
            f"worst callees, {least_op})")
    return _result(least, "composite-no-native-path", text, entry)


def _taken(entry: CompositePaths, c):
    """The path whose condition the call's recorded arguments meet, or None (no arguments, or undecided)."""
    values = getattr(c.args, "values", None)
    if values is None:
        return None
    names = dict(zip(entry.args, values))  # trailing defaults the call left out stay unbound (undecided)
    met = [p for p in entry.paths if p.code is not None and evaluate_when(p, names, c.kb.macos) is True]
    return met[0] if len(met) == 1 else None


def _judge_path(path, kb, judge: Judge) -> list[tuple[str, Classification]]:
    """(op, verdict) for each op the path reaches, and its sparse result when it returns one."""
    pairs = [(name, judge(OpKey.from_yaml(name), ())) for name in path.calls]
    if path.result:
        made_by = OpKey.from_yaml(path.calls[-1])
        pairs.append((f"its {path.result} result", predict_sparse(made_by, (path.result,), kb)))
    return pairs


def _named(pairs) -> str:
    return ", ".join(f"{op} ({found.verdict})" for op, found in pairs)


def _result(found: Classification, rule: str, text: str, entry: CompositePaths) -> Classification:
    source = " + ".join(dict.fromkeys(("composite_paths.yaml: " + entry.source, found.evidence.source)))
    return result(found.verdict, rule, text, source, found.remedy)
