"""Predict stage: the step as the predicted-for release's own Python code runs it.

The trace ran the installed torch's Python functions; each call records which of them issued it (OpCall.py,
trace/frames.py). py_drift.txt says which releases' code of those functions differs (knowledge/py_drift.py).
For a release R, `release_paths(trace, view, kb)` makes three changes to the MPS view and its verdicts:

- **earlier paths** (facts.yaml `earlier_paths` with `from`): where R's code of a function issued other ops than the
  installed one, the view's calls become the ops R ran (rule `earlier-path`: the fact's message and source,
  then the verdict of the op R ran). Calls inside a lens span (a C++ composite the lens caught) are the
  composite's own and stay;
- **missing APIs**: a call whose entry function (the torch function the step's code called) does not exist in
  R is `error` (rule `missing-api`): on R the step fails there with AttributeError or ImportError. Not when R
  binds the name another way (`pad = _add_docstr(torch._C._nn.pad, ...)`: py_drift.txt's `<assign>pad` unit),
  nor when the call comes from a library that feature-detects the API and runs its own code where R lacks it
  (FEATURE_DETECTED): then the entry is drift like any other (reviewed, or said in the notes);
- **unreviewed drift**: a function the step executed whose code differs in R, that no fact covers and that
  py_review.yaml does not put in one same-ops class with the installed version (or that py_drift.txt does not
  cover), keeps its rows' verdicts, but their evidence says R may dispatch other ops there, and the report's
  notes name the function: the scan never silently asserts a verdict for R on code R does not have.

A release whose code equals the installed one's changes nothing. Pure data: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opscan.knowledge import Knowledge
from opscan.knowledge.callees import SAMPLES, callees
from opscan.knowledge.facts import EarlierPath
from opscan.knowledge.py_drift import DRIFT_SOURCE, installed_hash, load_py_drift, same_ops
from opscan.mps_view import MpsCall
from opscan.opkey import OpKey
from opscan.verdict import Classification, Evidence, Verdict

# the public names of functions whose absence a step meets first (else the module path of the function)
API_NAMES = {"torch/_library/custom_ops.py": "torch.library.custom_op"}
# code whose per-release behaviour the AutocastMPS table models instead (knowledge/autocast.py; trace/amp.py records
# one `torch::amp.GradScaler` finding where the release lacks it, and steers unscale_ per release)
AMP_MODELLED = ("torch/amp/grad_scaler.py:",)
# torch APIs that a library looks up before calling and replaces with code of its own where the release lacks them;
# a call that comes from those library files (OpCall.caller) is no failure on such a release. timm 1.0.31:
# timm/layers/norm.py `try: from torch.nn.functional import rms_norm / except ImportError: from .fast_norm import
# rms_norm` (pow, mean, add, rsqrt, mul) and timm/layers/fast_norm.py `has_torch_rms_norm = hasattr(F, 'rms_norm')`
# (F.rms_norm from torch 2.4.0).
FEATURE_DETECTED = {"torch/nn/functional.py:rms_norm": ("/timm/layers/",)}
# libraries released in lockstep with torch (torchvision 0.15 with torch 2.0, ..., 0.29 with 2.14): a Mac on release R
# runs the one paired with R, not the installed one, so a torch API that the installed library calls and R lacks is
# that library's drift, not the user's failure. torchvision 0.29.1 registers roi_align's autograd in Python
# (torchvision/_autograd_registrations.py: torch.library.register_autograd, torch 2.4.0+); the torchvision of torch
# 2.0-2.3 registered it in C++ (csrc/ops/autograd/roi_align_kernel.cpp): its ops are judged by torchvision.yaml.
LOCKSTEP = ("/torchvision/", "/torchaudio/")


@dataclass(frozen=True)
class ReleasePaths:
    """The MPS view of one release and what changed it (see the module docstring)."""

    view: tuple[MpsCall, ...]
    origin: tuple[EarlierPath | None, ...]  # per view call: the fact that made it, if any
    chains: tuple[tuple[str, ...], ...]  # per view call: the torch functions that issued it (OpCall.py)
    missing: dict  # entry unit -> (API name, first covered release that has it or None)
    drifted: tuple[str, ...]  # units whose code differs in the release, with no fact or review
    release: str
    installed: str
    notes: tuple[str, ...] = ()


def release_paths(trace, view: tuple[MpsCall, ...], kb: Knowledge) -> ReleasePaths:
    """The view of `kb.release` (the same view object when nothing applies)."""
    table = load_py_drift()
    chains = tuple(_chain(trace, c) for c in view)
    installed = kb.installed_release or trace.torch_version
    if table is None or kb.release not in table.releases:
        return ReleasePaths(view, (None,) * len(view), chains, {}, (), kb.release, installed)
    # in step order (a set's order changes run to run, and the notes would with it)
    executed = tuple(dict.fromkeys(u for chain in chains for u in chain if not u.startswith(AMP_MODELLED)))
    differs = {u for u in executed if not table.covers(u, kb.release) or
               table.hash_in(u, kb.release) != installed_hash(u)}
    paths = tuple(p for p in kb.facts.python_paths if p.from_unit in differs)
    new_view, origin, chains = _substituted(trace, view, chains, paths, kb)
    missing = _missing(table, kb.release, chains, differs, _detected(trace, new_view, chains, differs))
    covered = {p.from_unit for p in paths} | {p.via for p in paths if p.via}
    drifted = tuple(u for u in executed if u in differs and u not in covered and u not in missing
                    and not (table.covers(u, kb.release) and same_ops(u, table.hash_in(u, kb.release),
                                                                         installed_hash(u))))
    found = ReleasePaths(new_view, origin, chains, missing, drifted, kb.release, installed)
    return replace(found, notes=_notes(found, table))


def _chain(trace, call: MpsCall) -> tuple[str, ...]:
    return trace.calls[call.index].py if 0 <= call.index < len(trace.calls) else ()


def _lens_spans(trace) -> frozenset[int]:
    return frozenset(i for g in trace.groups for i in range(g.start, g.end))


def _substituted(trace, view, chains, paths, kb):
    """(view, origin, chains) with the facts' calls in place of the ones they replace."""
    if not paths:
        return view, (None,) * len(view), chains
    inside = _lens_spans(trace)
    out: list[tuple[MpsCall, EarlierPath | None, tuple]] = []
    run: EarlierPath | None = None
    for call, chain in zip(view, chains):
        fact = _span_fact(paths, call, chain)
        if fact is not None:
            if fact is not run:
                out.extend((made, fact, chain) for made in _made(fact, call, kb))
            run = fact
            continue
        run = None
        fact = None if call.index in inside else _op_fact(paths, call, chain)
        out.extend([(made, fact, chain) for made in _made(fact, call, kb)] if fact else [(call, None, chain)])
    return tuple(c for c, _, _ in out), tuple(f for _, f, _ in out), tuple(ch for _, _, ch in out)


def _op_fact(paths, call: MpsCall, chain) -> EarlierPath | None:
    for p in paths:
        if p.op == call.op and chain[:1] == (p.from_unit,) and _via(p, chain) and _rank(p, call):
            return p
    return None


def _span_fact(paths, call: MpsCall, chain) -> EarlierPath | None:
    for p in paths:
        if p.ops is not None and p.from_unit in chain and _via(p, chain) and (not p.ops or call.op in p.ops):
            return p
    return None


def _via(path: EarlierPath, chain) -> bool:
    if path.via is None:
        return True
    at = chain.index(path.from_unit) if path.from_unit in chain else -1
    return 0 <= at < len(chain) - 1 and chain[at + 1] == path.via


def _rank(path: EarlierPath, call: MpsCall) -> bool:
    return path.rank is None or (bool(call.outputs) and len(call.outputs[0].shape) == path.rank)


def _made(path: EarlierPath, call: MpsCall, kb: Knowledge) -> list[MpsCall]:
    """The calls `path` puts where `call` was: its ops with the call's tensors (a composite with the callees
    composites.txt recorded for it)."""
    return [MpsCall(index=call.index, op=op, phase=call.phase, module=call.module, inputs=call.inputs,
                    outputs=call.outputs, dtypes=call.dtypes, cpu_op=call.cpu_op or call.op, rule="earlier-path",
                    callees=_callees(op, call.dtypes, kb)) for op in path.ran]


def _callees(op: OpKey, dtypes, kb: Knowledge) -> tuple | None:
    found = callees(op, kb, SAMPLES)
    if found is None:
        return None
    return tuple((OpKey.from_yaml(name), tuple(dtypes)) for name in found.paths[0].calls if "::" not in name)


def _detected(trace, view, chains, differs) -> frozenset[str]:
    """The entries (of `differs`: only those can be missing) whose every call came from library files that do not
    fail without them: FEATURE_DETECTED's (the library looks the API up first) and any entry called only from a
    LOCKSTEP library."""
    callers: dict[str, set] = {}
    for call, chain in zip(view, chains):
        if chain and chain[-1] in differs:
            at = trace.calls[call.index].caller if 0 <= call.index < len(trace.calls) else None
            callers.setdefault(chain[-1], set()).add(at[0].replace("\\", "/") if at else "")
    return frozenset(e for e, files in callers.items()
                     if all(any(lib in f for lib in (*FEATURE_DETECTED.get(e, ()), *LOCKSTEP)) for f in files))


def _bound(table, unit: str, release: str) -> bool:
    """Whether `unit`'s name is bound in `release` by an assignment (a C function under the same name)."""
    rel, _, qualname = unit.partition(":")
    scope, _, name = qualname.rpartition(".")
    assign = f"{rel}:{scope + '.' if scope else ''}<assign>{name}"
    return table.covers(assign, release) and table.hash_in(assign, release) is not None


def _missing(table, release: str, chains, differs, detected=frozenset()) -> dict:
    """entry unit -> (its API name, the first covered release that has it), for entries absent in `release`."""
    out = {}
    for chain in dict.fromkeys(chains):  # step order: the notes and rows read the same run to run
        entry = chain[-1] if chain else None
        if entry in differs and not entry.startswith(AMP_MODELLED) and table.covers(entry, release) \
                and table.hash_in(entry, release) is None and entry not in detected \
                and not _bound(table, entry, release):
            later = [r for r in table.releases if table.hash_in(entry, r) is not None]
            out[entry] = (_api(entry), later[0] if later else None)
    return out


def _api(unit: str) -> str:
    rel, _, qualname = unit.partition(":")
    if rel in API_NAMES:
        return API_NAMES[rel]
    return rel.removesuffix(".py").replace("/", ".") + "." + qualname


def _notes(paths: ReleasePaths, table) -> tuple[str, ...]:
    notes = [f"torch {paths.release} has no {api} ({unit} is not in its wheel): the rows the step issued through it "
             f"are errors (rule missing-api)" for unit, (api, _) in paths.missing.items()]
    for unit in paths.drifted:
        why = ("is not in py_drift.txt, so its code there is not known" if not table.covers(unit, paths.release)
               else f"differs from the installed torch {paths.installed}'s")
        notes.append(f"torch {paths.release}'s {unit} {why}, and no earlier_paths fact or reviewed same-ops class "
                     f"covers it: the rows it issued may not be what {paths.release} dispatches")
    return tuple(notes)


def judged(paths: ReleasePaths, predicted: list[Classification]) -> list[Classification]:
    """The view's verdicts with the release's paths applied: missing APIs, earlier paths, unreviewed drift."""
    memo: dict = {}
    out = []
    for found, fact, chain in zip(predicted, paths.origin, paths.chains):
        entry = chain[-1] if chain else None
        if entry in paths.missing:
            key = ("missing", entry)
            if key not in memo:
                memo[key] = _missing_api(paths, entry)
        else:
            drift = tuple(u for u in chain if u in paths.drifted)
            key = (id(found), fact, drift)
            if key not in memo:
                memo[key] = _drift_said(paths, _from_fact(paths, found, fact), drift)
        out.append(memo[key])
    return out


def _missing_api(paths: ReleasePaths, entry: str) -> Classification:
    api, since = paths.missing[entry]
    text = (f"torch {paths.release} has no {api}: the step calls it ({entry} is not in torch {paths.release}'s "
            f"wheel), so on {paths.release} it raises there instead of dispatching this op")
    remedy = (f"upgrade to torch {since} or later, or avoid {api}" if since else f"avoid {api}")
    return Classification(Verdict.ERROR, Evidence("missing-api", text, DRIFT_SOURCE), remedy)


def _from_fact(paths: ReleasePaths, found: Classification, fact: EarlierPath | None) -> Classification:
    if fact is None:
        return found
    text = (f"torch {paths.release}'s {fact.from_unit} ran other ops than the installed torch {paths.installed}'s "
            f"({fact.message}); {found.evidence.text}")
    source = " + ".join(dict.fromkeys((fact.source, found.evidence.source)))
    return replace(found, evidence=Evidence("earlier-path", text, source))


def _drift_said(paths: ReleasePaths, found: Classification, drift: tuple[str, ...]) -> Classification:
    if not drift:
        return found
    text = (f"{found.evidence.text}; not checked for torch {paths.release}: its code of {', '.join(drift)} differs "
            f"from the installed torch {paths.installed}'s and no fact or review covers it, so {paths.release} may "
            "dispatch other ops here")
    source = f"{found.evidence.source} + {DRIFT_SOURCE}"
    return replace(found, evidence=replace(found.evidence, text=text, source=source))
