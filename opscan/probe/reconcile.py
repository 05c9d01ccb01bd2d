"""Probe stage: probe outcomes -> one measurement per report row, and the report's `measurement` section.

A row is measured through every probe that stands for its calls; its measured verdict is the worst of
theirs (a call that could not be replayed counts as `unknown`, so a row is only as measured as its
least measured call). The row's `measured` block keeps the device, that worst probe's two passes, the
largest errors against the reference and how outputs were compared. Pure data: no torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from opscan.probe.comparison import TOLERANCES
from opscan.probe.decide import SOURCE, Decision, decide
from opscan.verdict import Evidence, Verdict

REMEDIES = {
    Verdict.NATIVE: None,
    Verdict.UNKNOWN: "check on a Mac with PYTORCH_MPS_LOG_PROFILE_INFO=68, or add an op_probes builder for this op",
    Verdict.CPU_FALLBACK: "accept the CPU round trip, or replace the op; PYTORCH_MPS_LOG_PROFILE_INFO=68 lists each "
                          "fallback",
    Verdict.UNSUPPORTED: "set PYTORCH_ENABLE_MPS_FALLBACK=1 before importing torch (the op then runs on the CPU), or "
                         "replace the op",
    Verdict.UNSUPPORTED_DTYPE: "cast to a dtype MPS supports (float32 for float64) before the op",
    Verdict.MISMATCH: "compare this op's output on the Mac with the CPU before trusting it; move it to the CPU",
    Verdict.ERROR: "move this op to the CPU, or change the arguments that trip the kernel",
    Verdict.CRASH: "move this op to the CPU and report the crash to PyTorch with the probe's repro",
    Verdict.TIMEOUT: "move this op to the CPU, or raise --probe-timeout if it is only slow",
}


@dataclass(frozen=True)
class Where:
    """Where probes ran: the label reports show, whether it stands for MPS, whether it was a test double."""

    label: str
    stands_for_mps: bool
    simulated: bool = False
    virtual: tuple[str, ...] = ()  # the signals that this Mac is a virtual machine (backends.virtual_machine)


@dataclass(frozen=True)
class RowMeasurement:
    """What the probes measured for one row (duck-typed by report.measured_rows)."""

    verdict: Verdict
    evidence: Evidence
    remedy: str | None
    block: dict


def measure_calls(plan, result) -> tuple[Verdict, ...]:
    """The measured verdict of each MPS-view call, in view order: the worst of the probes that stand for it (a
    call with no probe, or one that could not be replayed, is unknown). The step graph is rebuilt on these."""
    found = {pid: _probe_decision(pid, plan, result)[0].verdict for ids in plan.per_call for pid in ids}
    return tuple(max((found[pid] for pid in ids), key=lambda v: v.rank, default=Verdict.UNKNOWN)
                 for ids in plan.per_call)


def measure_rows(plan, result, label: str) -> dict:
    """Row key (OpKey, dtypes) -> RowMeasurement, for every row of the plan."""
    out = {}
    for key, ids in plan.rows.items():
        found = [_probe_decision(pid, plan, result) for pid in ids]
        worst = max(found, key=_severity)
        decision, off, on = worst
        comparisons = [o.comparison for _, o, _ in found if o is not None and o.comparison is not None]
        comparisons += [o.comparison for _, _, o in found if o is not None and o.comparison is not None]
        block = {
            "device": label,
            "verdict": decision.verdict.value,
            "rule": decision.rule,
            "text": decision.text,
            "probes": len(ids),
            "off": _pass(off),
            "on": _pass(on),
            "max_abs_err": _max(c.max_abs for c in comparisons),
            "max_rel_err": _max(c.max_rel for c in comparisons),
            "compared": sorted({c.how for c in comparisons}),
            "reference": sorted({c.reference for c in comparisons}),
        }
        evidence = Evidence(decision.rule, f"measured on {label}: {decision.text}", SOURCE)
        out[key] = RowMeasurement(decision.verdict, evidence, REMEDIES[decision.verdict], block)
    return out


def _severity(found) -> tuple:
    """Worst verdict first; among equals an unchecked probe, so a row is only as checked as its least checked."""
    return found[0].verdict.rank, found[0].rule.endswith("-unchecked")


def _probe_decision(pid: str, plan, result):
    if pid in plan.unreplayable:
        return Decision(Verdict.UNKNOWN, "probe-unreplayable", plan.unreplayable[pid]), None, None
    off, on = result.off.get(pid), result.on.get(pid)
    if off is None:
        return Decision(Verdict.UNKNOWN, "probe-incomplete", "the probe has no outcome"), None, None
    return decide(off, on), off, on


def _pass(outcome) -> dict | None:
    if outcome is None:
        return None
    first = (outcome.message or "").strip().splitlines()
    out = {"status": outcome.status, "exc_type": outcome.exc_type, "message": first[0][:400] if first else None,
           "fallback_seen": outcome.fallback_seen, "signal": outcome.signal, "confirmed": outcome.confirmed}
    feed = (outcome.extra or {}).get("feed")
    if feed:  # the inputs a forward made: which forward, and where it ran (worker.py)
        out["feed"] = feed
    return out


def _max(values) -> float | None:
    found = [v for v in values if v is not None]
    return max(found) if found else None


def probe_verdicts(plan, result) -> Counter:
    """How many probes (and unreplayable calls) ended with each verdict."""
    counts = Counter(decide(result.off[p.id], result.on.get(p.id)).verdict.value for p in plan.probes
                     if p.id in result.off)
    counts["unknown"] += len(plan.unreplayable)
    return counts


def measurement_section(plan, result, options, where: Where, isolation: str, journal: str | None, run: dict) -> dict:
    """The report's top-level `measurement` section (see docs/measured-mode.md)."""
    envs = result.environments
    return {
        "source": "measured",
        "device": where.label,
        "stands_for_mps": where.stands_for_mps,
        "simulated": where.simulated,
        "note": _note(where),
        **({"virtual_machine": {"detected": True, "signals": list(where.virtual)}} if where.virtual else {}),
        "probes": len(plan.probes),
        "calls": plan.calls,
        "unreplayable": sorted(set(plan.unreplayable.values())),
        "passes": {"off": {"probes": len(result.off), "fallback_env": "unset"},
                   "on": {"probes": len(result.on), "fallback_env": "1"}},
        "outcomes": dict(sorted(probe_verdicts(plan, result).items())),
        "shapes": _shapes(plan, result),
        "saved_inputs": _saved(plan, result),
        "tolerances": {d: {"atol": a, "rtol": r} for d, (a, r) in TOLERANCES.items()},
        "tolerance_rule": "|out - ref| <= atol * max(1, max|ref|) + rtol * |ref|, dtype = least precise floating "
                          "dtype of the call; integers exact; random and tie-breaking index outputs by properties; "
                          "outputs of undefined content (empty*, new_empty*, resize_, set_) by shape and dtype; "
                          "a pass with no reference or no output is unchecked, never within tolerance",
        "isolation": isolation,
        "workers": options.workers,
        "timeout_s": options.timeout,
        "journal": journal,
        "environment": {"off": envs.get("off"), "on": envs.get("on")},
        "run": run,
    }


def _note(where: Where) -> str:
    if where.virtual:
        return (f"measured on a VIRTUAL Mac ({', '.join(where.virtual)}): its MPS is a paravirtualised GPU, not "
                "Apple Silicon (GitHub's hosted macOS runners report MPS available, then fail or differ), so the "
                "verdicts, step graph, transfers and lane stay predicted for MPS; each row's `measured` block "
                "describes that virtual machine only — measure on a physical Apple Silicon Mac")
    if where.simulated:
        return (f"SIMULATED on {where.label}, a test double of the device, not a measurement of MPS: the verdicts, "
                "the step graph, the transfers and the lane follow the simulation (test runs only)")
    if where.stands_for_mps:
        return (f"measured on {where.label}: the verdicts, the step graph, the transfers and the lane are measured; "
                "the memory estimate and the upgrade advice stay predicted")
    return (f"measured on {where.label} (not MPS): verdicts, step graph, transfers and lane stay predicted for MPS; "
            f"each row's `measured` block describes {where.label} only")


def _saved(plan, result) -> dict:
    """How the probes that consume a forward's outputs got them: by that forward on the device (the off pass),
    on the CPU after it raised there, or as recorded (feeds.py), with each way's count."""
    made = Counter()
    for pid, how in plan.saved.items():
        feed = ((result.off.get(pid) and result.off[pid].extra) or {}).get("feed") or {}
        where = feed.get("made")
        made[how if not where else f"by {feed.get('op')} on {where}"] += 1
    return {"probes": len(plan.saved), "made": dict(sorted(made.items()))}


def _shapes(plan, result) -> dict:
    if not plan.max_elements:
        return {"policy": "full", "max_elements": None, "capped_probes": 0}
    ran_capped = sum(1 for o in result.off.values() if (o.extra or {}).get("shapes") == "capped")
    return {"policy": "capped", "max_elements": plan.max_elements, "capped_probes": ran_capped,
            "capped_refused_on_cpu": plan.capped - ran_capped}
