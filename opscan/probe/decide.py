"""Probe stage: the contract's decision table — two passes of one probe -> a measured verdict. Pure.

| off pass                                   | on pass            | vs reference    | verdict                 |
|--------------------------------------------|--------------------|-----------------|-------------------------|
| inputs could not be built                  |                    |                 | unknown (why)           |
| signal in either pass                      |                    |                 | crash (signal named)    |
| limit hit in either pass                   |                    |                 | timeout                 |
| ran, no fallback seen                      | —                  | within / beyond | native / mismatch       |
| ran, no fallback seen                      | —                  | unchecked       | native, says unchecked  |
| ran, fallback seen (always-CPU op)         | —                  | within / beyond | cpu_fallback / mismatch |
| NotImplementedError "…for the MPS device"  | ran                | within / beyond | unsupported / mismatch  |
| NotImplementedError "…for the MPS device"  | raised             | —               | error (both messages)   |
| dtype error (texts.DTYPE_TEXTS)            | —                  | —               | unsupported_dtype       |
| other exception                            | same or other      | —               | error                   |

"unchecked": nothing was compared (no CPU reference could run, or the call has no output); the verdict keeps
what the run showed, its rule is `probe-native-unchecked` (or its text says so) and it never claims agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

from opscan.probe.protocol import PassOutcome
from opscan.probe.texts import DISTRIBUTED, NOT_IMPLEMENTED, is_dtype_error
from opscan.verdict import Verdict

SOURCE = "probe: contract decision table (opscan/probe/decide.py); texts from mps_facts.md §1.4, §4.2"


@dataclass(frozen=True)
class Decision:
    """A measured verdict for one probe with a stable rule id and a sentence."""

    verdict: Verdict
    rule: str
    text: str


def decide(off: PassOutcome, on: PassOutcome | None) -> Decision:
    """The verdict of one probe from its off pass (variable unset) and its on pass (variable "1")."""
    if off.status == "unbuildable":
        return Decision(Verdict.UNKNOWN, "probe-unbuildable", f"the probe's inputs could not be built: {off.message}")
    for outcome in (off, on):
        if outcome is not None and outcome.status == "crash":
            return Decision(Verdict.CRASH, "probe-crash", f"the probe's process died ({outcome.signal}) in the "
                                                          f"{outcome.pass_name} pass{_confirmed(outcome)}")
    for outcome in (off, on):
        if outcome is not None and outcome.status == "timeout":
            return Decision(Verdict.TIMEOUT, "probe-timeout", f"{outcome.message} ({outcome.pass_name} pass)")
    if off.status == "ran":
        return _ran(off, "with PYTORCH_ENABLE_MPS_FALLBACK unset")
    return _raised(off, on)


def _ran(outcome: PassOutcome, how: str) -> Decision:
    comparison = outcome.comparison
    fell_back = outcome.fallback_seen
    where = f"ran {how}" + (f", through the CPU fallback ({', '.join(_ops(outcome))})" if fell_back else "")
    if comparison is not None and comparison.beyond:
        return Decision(Verdict.MISMATCH, "probe-mismatch",
                        f"{where}, but disagrees with the {comparison.reference} CPU reference: {comparison.detail}")
    if fell_back and how.endswith("unset"):
        return Decision(Verdict.CPU_FALLBACK, "probe-cpu-fallback",
                        f"{where}: PyTorch warned that it runs on the CPU even without the variable"
                        f"{_agreement(comparison)}")
    rule = "probe-native" if comparison is not None and comparison.checked else "probe-native-unchecked"
    return Decision(Verdict.NATIVE, rule, f"{where}{_agreement(comparison)}")


def _raised(off: PassOutcome, on: PassOutcome | None) -> Decision:
    first = _first_line(off)
    if NOT_IMPLEMENTED.search(off.message or "") and not DISTRIBUTED.search(off.message or ""):
        if on is None:
            return Decision(Verdict.UNKNOWN, "probe-incomplete", f"{first}; the pass with the variable set did "
                                                                 "not run")
        if on.status == "ran":
            decision = _ran(on, "with PYTORCH_ENABLE_MPS_FALLBACK=1")
            if decision.verdict == Verdict.MISMATCH:
                return decision
            return Decision(Verdict.UNSUPPORTED, "probe-unsupported",
                            f"{first} with the variable unset; {decision.text}")
        return Decision(Verdict.ERROR, "probe-error-both",
                        f"{first} with the variable unset; with it set: {_first_line(on)}")
    if is_dtype_error(off.message or ""):
        return Decision(Verdict.UNSUPPORTED_DTYPE, "probe-dtype", first)
    other = f"; with the variable set: {_first_line(on)}" if on is not None and on.status == "raised" \
        and on.message != off.message else ""
    return Decision(Verdict.ERROR, "probe-error", f"{first}{other}")


def _first_line(outcome: PassOutcome) -> str:
    lines = (outcome.message or "").strip().splitlines() or [""]
    return f"{outcome.exc_type}: {lines[0][:400]}"


def _ops(outcome: PassOutcome) -> list[str]:
    return list(outcome.extra.get("fallback_ops") or ["fallback warning"])


def _agreement(comparison) -> str:
    """What the comparison showed, in words; never "agrees" when nothing was compared."""
    if comparison is None or not comparison.checked:
        why = (comparison.detail if comparison is not None else None) or "no comparison was recorded"
        return f"; its values were NOT checked ({why})"
    if comparison.how == "shape":
        return (f", its outputs hold undefined values (allocated, not filled): shape and dtype agree with the "
                f"{comparison.reference} CPU reference, values not compared")
    error = f", max abs error {comparison.max_abs:.3g}" if comparison.max_abs else ""
    return f", agrees with the {comparison.reference} CPU reference ({comparison.how}{error})"


def _confirmed(outcome: PassOutcome) -> str:
    return f"; {outcome.confirmed}" if outcome.confirmed else ""
