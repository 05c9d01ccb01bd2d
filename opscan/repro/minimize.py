"""Repro stage: minimise a shape-dependent failure — shrink a failing call's sizes while the same failure persists.

Sizes are shrunk by value, as `--max-elements` does (opscan/probe/shrink.py): a size s becomes w in every
tensor dimension and in every integer argument equal to s, so the call stays consistent; recorded integer
values are remade by op_probes (a call that cannot be rebuilt that way is a different outcome, never a
pass). For each size, largest first, the candidates (1, 2, ..., and fractions of s) run as one batch in
the real probe workers (pooled, a failing probe re-run alone in a fresh process: the isolation of measured
mode, fallback variable unset), and the smallest candidate that fails the SAME way is kept: the same
status, exception type and first message line with numbers normalised (or, for a call that ran, the same
beyond-tolerance or fallback result). Then each kept size is tried one smaller, giving the boundary: the
smallest failing shapes and the next smaller shapes that pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from opscan.probe.protocol import PassOutcome, ProbeCall

SMALL_SIZES = tuple(range(1, 9))  # every size up to 8 is a candidate
MAX_CANDIDATES = 12


@dataclass(frozen=True)
class Boundary:
    """What minimisation found for one call (shapes as lists of lists)."""

    original: list
    failure: str  # the failure kept while shrinking, in words
    reproduced: bool  # the original call failed on the device (else nothing was minimised)
    call: ProbeCall  # the smallest failing call (the original one when nothing could be shrunk)
    outcome: PassOutcome  # its outcome
    fails_at: list
    passes_at: list | None  # a next smaller shape that passes (None: every smaller one failed differently)
    probes: int  # probes run
    label: str  # where they ran ("mps", or the test double's name in tests)
    sizes: dict = field(default_factory=dict)  # original size -> {"kept", "fails", "passes"}: the smaller sizes tried

    def to_dict(self) -> dict:
        """The `minimized` block of a call entry (and of the script's header)."""
        return {"original": self.original, "fails_at": self.fails_at, "passes_at": self.passes_at,
                "failure": self.failure, "device": self.label, "probes": self.probes,
                "sizes": {str(k): v for k, v in self.sizes.items()}}


def failure_key(outcome: PassOutcome) -> tuple | None:
    """What a failure is, numbers normalised; None when the call ran cleanly (agreed, no fallback)."""
    if outcome.status == "ran":
        if outcome.comparison is not None and outcome.comparison.beyond:
            return ("beyond tolerance",)
        return ("fallback",) if outcome.fallback_seen else None
    first = ((outcome.message or "").strip().splitlines() or [""])[0]
    return (outcome.status, outcome.exc_type or outcome.signal, re.sub(r"\d+", "N", first))


def candidates(size: int) -> list[int]:
    """Smaller sizes to try for `size`, ascending."""
    found = {w for w in SMALL_SIZES} | {size // 8, size // 4, size // 2, size - 1}
    return sorted(w for w in found if 1 <= w < size)[:MAX_CANDIDATES]


def mapped(call: ProbeCall, mapping: dict[int, int]) -> ProbeCall:
    """The call with sizes mapped by value (a fresh id and seed: its signature changed)."""
    from opscan.probe import shrink
    from opscan.probe.calls import make

    if not any(k != v for k, v in mapping.items()):
        return call
    capped = shrink.apply(replace(call, shrink=dict(mapping)))
    return make(capped.op, capped.tensors, capped.spec, capped.feed)


def shapes(call: ProbeCall) -> list:
    """The call's tensor shapes."""
    return [list(t.shape) for t in call.tensors]


def minimize(call: ProbeCall, device: str, timeout: float = 60.0, workers: int = 2, double=None) -> Boundary:
    """Shrink `call` on `device` (or on the test double `double`, tests only) while its failure persists (see the
    module docstring)."""
    prober = Prober(device, timeout, workers, double)
    try:
        return _search(call, prober)
    finally:
        prober.close()


def _search(call: ProbeCall, prober: Prober) -> Boundary:
    first = prober.run([call])[call.id]
    key = failure_key(first)
    if key is None or first.status == "unbuildable":
        return Boundary(shapes(call), _words(first), False, call, first, shapes(call), None, prober.count,
                        prober.label)
    mapping: dict[int, int] = {}
    best, best_outcome, sizes = call, first, {}
    for size in sorted({s for t in call.tensors for s in t.shape if s > 1}, reverse=True):
        tried = [(w, mapped(call, {**mapping, size: w})) for w in candidates(size)]
        outcomes = prober.run([c for _, c in tried])
        keys = {w: failure_key(outcomes[c.id]) for w, c in tried}
        sizes[size] = {"kept": size, "fails": [w for w, k in keys.items() if k == key] + [size],
                       "passes": [w for w, c in tried if keys[w] is None and outcomes[c.id].status == "ran"]}
        for w, cand in tried:
            if keys[w] == key:
                mapping[size], best, best_outcome = w, cand, outcomes[cand.id]
                sizes[size]["kept"] = w
                break
    passes = _passing_neighbour(call, mapping, prober)
    return Boundary(shapes(call), _words(first), True, best, best_outcome, shapes(best), passes, prober.count,
                    prober.label, sizes)


def _passing_neighbour(call: ProbeCall, mapping: dict[int, int], prober: Prober) -> list | None:
    """Shapes one step smaller than the minimum (one kept size minus one) that run cleanly, if any."""
    final = {s: mapping.get(s, s) for t in call.tensors for s in t.shape if s > 1}
    tried = [mapped(call, {**final, size: now - 1}) for size, now in sorted(final.items(), key=lambda kv: -kv[1])
             if now > 1]
    if not tried:
        return None
    outcomes = prober.run(tried)
    return next((shapes(c) for c in tried if failure_key(outcomes[c.id]) is None
                 and outcomes[c.id].status == "ran"), None)


def _words(outcome: PassOutcome) -> str:
    if outcome.status == "ran":
        key = failure_key(outcome)
        return "ran cleanly" if key is None else f"ran, {key[0]}"
    first = ((outcome.message or "").strip().splitlines() or [""])[0]
    return f"{outcome.status} {outcome.exc_type or outcome.signal}: {first[:300]}"


class _Kept:
    """A launcher whose close() waits for the minimiser: one zygote (or pool) serves every batch."""

    def __init__(self, launcher):
        self.launcher = launcher

    def start(self):
        """A new worker from the kept launcher."""
        return self.launcher.start()

    def close(self) -> None:
        """Kept open: Prober.close() closes it."""


class Prober:
    """The off pass of the real probe runner (fallback variable unset), batch after batch."""

    def __init__(self, device: str, timeout: float, workers: int, double=None):
        from opscan.probe.runner import Pool, RunnerOptions

        options = RunnerOptions(device=device, workers=workers, timeout=timeout, double=double)
        self.pool = Pool("off", options, lambda o: None)
        self.inner = self.pool.launcher
        self.pool.launcher = _Kept(self.inner)
        self.count = 0
        self.device = device

    def run(self, probes: list[ProbeCall]) -> dict[str, PassOutcome]:
        """Every probe's outcome, by id."""
        self.count += len(probes)
        return self.pool.run(probes)

    @property
    def label(self) -> str:
        """Where the probes ran: the device, or a test double's name (tests)."""
        hello = self.pool.hello or {}
        return hello.get("backend", self.device) if hello.get("simulated") else self.device

    def close(self) -> None:
        """Stop the workers' launcher."""
        self.inner.close()


@dataclass(frozen=True)
class Minimized:
    """`opscan repro --minimize` over the selected findings: each with its minimised call, a boundary line per
    finding tried (stdout), a line per finding with no buildable call (stderr), and whether all were minimised."""

    findings: list
    lines: list
    notes: list
    all_minimised: bool


def minimize_findings(findings: list[dict], device: str, timeout: float, double=None) -> Minimized:
    """Minimise the first buildable call of each finding of the report's repro section on `device` (or on the test
    double `double`: tests only, never from the command line)."""
    out, lines, notes, all_minimised = [], [], [], True
    for finding in findings:
        calls = [c for c in finding.get("calls") or [] if not c.get("unbuildable")]
        if not calls:
            notes.append(f"{_head(finding)}: {_why_unbuildable(finding)}; nothing to minimise")
            all_minimised = False
            out.append(finding)
            continue
        boundary = minimize(ProbeCall.from_dict(calls[0]["probe"]), device, timeout, double=double)
        lines.append(_boundary_line(finding, boundary))
        all_minimised = all_minimised and boundary.reproduced
        out.append(_with_boundary(finding, boundary) if boundary.reproduced else finding)
    return Minimized(out, lines, notes, all_minimised)


def _with_boundary(finding: dict, boundary: Boundary) -> dict:
    """The finding with its minimised call as its only call."""
    from opscan.repro.section import call_entry, outcome_entry

    entry = {**call_entry(boundary.call), "original_shapes": boundary.original, "minimized": boundary.to_dict()}
    entry["outcomes"] = {boundary.label: outcome_entry(boundary.outcome)}
    return {**finding, "calls": [entry], "more_calls": 0}


def _head(finding: dict) -> str:
    return f"{finding['op']} [{','.join(finding['dtypes'])}]"


def _why_unbuildable(finding: dict) -> str:
    """Why no call of the finding can be built (the section's own words)."""
    reasons = [c["unbuildable"] for c in finding.get("calls") or [] if c.get("unbuildable")]
    reasons += finding.get("unreplayable") or []
    return "no call of it can be built" + (f" ({reasons[0]})" if reasons else " (the report recorded none)")


def _boundary_line(finding: dict, boundary: Boundary) -> str:
    head = _head(finding)
    if not boundary.reproduced:
        return f"{head}: did not fail on {boundary.label} ({boundary.failure}); nothing to minimise"
    passes = f"passes at {boundary.passes_at}" if boundary.passes_at else "no smaller shape passes"
    sizes = "; ".join(f"size {size}: fails at {v['fails']}, passes at {v['passes']}"
                      for size, v in boundary.sizes.items())
    return (f"{head}: fails at {boundary.fails_at}, {passes}; original {boundary.original} ({sizes}) — "
            f"{boundary.failure[:160]} ({boundary.probes} probes on {boundary.label})")
