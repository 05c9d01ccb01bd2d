"""Predict stage: a call that meets the condition of a known silent-correctness bug (knowledge/silent_bugs.yaml).

A call MPS would run (`native`, or `unknown` when the facts don't decide) whose arguments meet an entry's
condition in a release the entry affects, on the assumed macOS, gets the contract's `mismatch` verdict, predicted
(rule `silent-bug-<id>`): it runs and returns wrong numbers. An entry limited to some chip families decides only
when the user named the chip (`--chip`); otherwise, and when only the assumed macOS (the release's minimum, not a
`--macos` the user gave) keeps an entry from applying, the call keeps its verdict and its evidence gets a note.
predict/bind.py names the call's arguments for the conditions. Pure: no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from opscan.knowledge.conditions import evaluate_when
from opscan.knowledge.silent_bugs import SilentBug, load_bugs
from opscan.predict.bind import arguments, recording
from opscan.verdict import Classification, Evidence, Verdict

PREFIX = "silent-bug-"
_JUDGED = frozenset({Verdict.NATIVE, Verdict.UNKNOWN})  # verdicts whose call runs on MPS's own kernels


@dataclass(frozen=True)
class _Code:
    """The compiled condition of one entry for one op (what evaluate_when reads)."""

    code: object


@functools.lru_cache(maxsize=1)
def silent_ops() -> frozenset[str]:
    """Every yaml op name some entry concerns, in any release."""
    return frozenset(op for bug in load_bugs() for op in bug.ops)


def key(call) -> tuple | None:
    """What of a call a silent-bug condition can read (its tensors' layout and its arguments, not their storage
    identity), for predict_call's cache; None for ops no entry concerns."""
    if call.op.namespace != "aten" or call.op.yaml_name not in silent_ops():
        return None
    tensors = tuple((t.dtype, t.shape, t.stride, t.offset, t.requires_grad, t.host)
                    for t in (*call.inputs, *call.outputs))
    return tensors, repr(call.attrs), repr(call.call)


def silent_verdict(call, kb, found: Classification) -> Classification:
    """`found`, or the predicted mismatch of the first entry of kb.release whose condition the call meets (with a
    note for entries that meet it only on a chip or a macOS the scan does not assume)."""
    bugs = kb.silent.get(call.op.yaml_name) if call.op.namespace == "aten" else None
    if not bugs or found.verdict not in _JUDGED:
        return found
    names = arguments(call, recording(kb))
    if names is None:
        return found
    notes = []
    for bug in bugs:
        if not evaluate_when(_Code(bug.code[call.op.yaml_name]), names, kb.macos, kb.chip):
            continue
        gate = _gate(bug, kb)
        if gate is None:
            return mismatch(bug, call, kb)
        if gate:
            notes.append(gate)
    if not notes:
        return found
    text = f"{found.evidence.text}; note: {'; '.join(notes)}"
    return Classification(found.verdict, Evidence(found.evidence.rule, text, found.evidence.source), found.remedy,
                          found.since)


def _gate(bug: SilentBug, kb) -> str | None:
    """None when the entry applies on the assumed chip and macOS; else a note ("" when none is due)."""
    if bug.chip and kb.chip is None:
        return (f"it meets the condition of known MPS silent bug {bug.rule} ({bug.title}), which shows on "
                f"{'/'.join(bug.chip)} chips only: give --chip to decide")
    if bug.chip and kb.chip not in bug.chip:
        return ""
    if not bug.macos_applies(kb.macos):
        if kb.macos_source == "--macos":
            return ""
        return (f"it meets the condition of known MPS silent bug {bug.rule} ({bug.title}) on {bug.macos_text}; "
                f"the scan assumes macOS {'.'.join(map(str, kb.macos))} (give --macos to decide)")
    return None


def mismatch(bug: SilentBug, call, kb) -> Classification:
    """The predicted mismatch of `call` under `bug`."""
    where = "; ".join(p for p in (bug.macos_text, f"{'/'.join(bug.chip)} chips" if bug.chip else None) if p)
    fixed = (f"fixed in torch {bug.fixed_in}" if bug.fixed_in
             else "open: no release fixes it yet")
    text = (f"{call.op} meets the condition of a known MPS silent-correctness bug in torch {kb.release}: "
            f"{bug.title} [{bug.when[call.op.yaml_name]}]{f' on {where}' if where else ''}; it runs and returns "
            f"wrong values. Affected {bug.releases}, {fixed}; releases established ({bug.confidence} confidence): "
            f"{bug.established}")
    upgrade = (f"torch {bug.fixed_in} fixes it" if bug.fixed_in
               else f"no torch release fixes it yet (open: {bug.source})")
    remedy = f"{bug.workaround} ({upgrade})"
    return Classification(Verdict.MISMATCH, Evidence(bug.rule, text, f"{bug.source}; opscan silent_bugs.yaml"),
                          remedy)


def size_entry(call, release: str) -> SilentBug | None:
    """The first entry with a size condition that affects `release` and whose condition the call meets, whatever
    the macOS and chip (a probe runs on the Mac it runs on): measured mode probes such a call at its real size."""
    from opscan.knowledge.silent_bugs import bugs_for_release as for_release
    from opscan.opkey import Release

    try:
        release = Release.drop_local(release)
        bugs = for_release(release) if release else {}
    except ValueError:
        return None
    found = [b for b in bugs.get(call.op.yaml_name, ()) if b.size_condition] if call.op.namespace == "aten" else []
    names = arguments(call, release) if found else None
    for bug in found if names is not None else ():
        if evaluate_when(_Code(bug.code[call.op.yaml_name]), names, (99, 0), bug.chip[0] if bug.chip else None):
            return bug
    return None


def entry_of(rule: str) -> SilentBug | None:
    """The entry a `silent-bug-<id>` rule id names."""
    if not rule.startswith(PREFIX):
        return None
    return next((b for b in load_bugs() if b.id == rule[len(PREFIX):]), None)


def by_id() -> Mapping[str, SilentBug]:
    """Every entry by id."""
    return {b.id: b for b in load_bugs()}
