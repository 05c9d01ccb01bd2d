"""Accept stage (render): the acceptance result as text — the console summary and comparison.md. Pure."""

from __future__ import annotations

from collections import defaultdict

from opscan.accept.spec import KINDS
from opscan.units import human_bytes

SHOWN_FAILURES = 5


def kind_rows(comparisons) -> list[dict]:
    """Per (pair, kind): tensors compared, failed, the worst errors and the tolerance held to."""
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for c in comparisons:
        groups[(c.pair, c.kind)].append(c)
    rows = []
    for (pair, kind), items in sorted(groups.items(), key=lambda kv: (kv[0][0] != "target-vs-reference",
                                                                        kv[0][0], KINDS.index(kv[0][1]))):
        rows.append({"pair": pair, "kind": kind, "compared": len(items), "failed": sum(not c.ok for c in items),
                     "worst_rel": max(c.rel_err for c in items), "worst_rms": max(c.abs_err for c in items),
                     "worst_max_abs": max(c.max_abs_err for c in items),
                     "rtol": items[0].rtol, "atol": items[0].atol})
    return rows


def console(result) -> str:
    """The summary printed on stdout (table format)."""
    o = result.options
    lines = [f"opscan accept {o.target}: {o.device} ({o.dtype}) against {o.reference} (float32), "
             f"seed {o.spec.seed}, {o.spec.iterations} iterations + eval + checkpoint round trip",
             f"  dropout: {result.choices['dropout']}", f"  TF32: {result.choices['tf32']}"]
    if result.choices.get("perturb"):
        lines.append(f"  perturbed: {result.choices['perturb']}")
    lines += ["", _table(kind_rows((*result.comparisons, *result.round_trip))), ""]
    lines += _failures(result)
    lines += placement_lines(result.target_run.placement)
    lines += _lanes(result)
    return "\n".join(lines) + "\n"


def _table(rows: list[dict]) -> str:
    head = f"{'compared':<34} {'kind':<10} {'tensors':>7} {'failed':>6} {'worst rel':>9} {'worst rms':>9}  tolerance"
    body = [f"{r['pair']:<34} {r['kind']:<10} {r['compared']:>7} {r['failed']:>6} {_e(r['worst_rel']):>9} "
            f"{_e(r['worst_rms']):>9}  rtol {r['rtol']:g} / atol {r['atol']:g}" for r in rows]
    return "\n".join([head, *body])


def _failures(result) -> list[str]:
    first = result.first_divergence
    lines = [f"target run: STOPPED — {result.target_failure}"] if result.target_failure else []
    lines.append(f"first divergence: {first.line()}" if first else "first divergence: none (every tensor "
                 "compared within tolerance)")
    failing = [c for c in result.comparisons if not c.ok]
    for c in failing[1:SHOWN_FAILURES]:
        lines.append(f"  then: {c.line()}")
    if len(failing) > SHOWN_FAILURES:
        lines.append(f"  ... {len(failing) - SHOWN_FAILURES} more beyond tolerance (comparison.json)")
    trip = result.round_trip_failure
    if not result.round_trip:
        lines.append("checkpoint round trip: not run (the target run stopped before it)")
        return lines
    lines.append(f"checkpoint round trip: FAILS — {trip.line()}" if trip else
                 "checkpoint round trip: passes (saved on the target, reloaded with weights_only=True on both, "
                 "one step continued)")
    return lines


def placement_lines(placement) -> list[str]:
    """Where things ran on the target: devices, fallbacks, explicit transfers, peak memory."""
    devices = " · ".join(f"{kind} {', '.join(f'{d} {n}' for d, n in where.items())}"
                         for kind, where in placement.devices.items() if where)
    lines = [f"where things ran ({placement.device}): {devices or 'not counted'}"]
    if placement.fallbacks:
        lines += [f"  fallback: {f.op} ×{f.count} in {'/'.join(f.phases)} ({', '.join(f.modules)})"
                  for f in placement.fallbacks]
    else:
        lines.append("  fallbacks: none")
    moves = [t for t in placement.transfers if t.phase != "checkpoint"]
    if moves:
        lines += [f"  transfer: {t.op} {t.source} -> {t.destination} {human_bytes(t.bytes)} ×{t.count} in "
                  f"{t.module or 'outside the model'} ({t.phase})" for t in moves]
    else:
        lines.append("  explicit transfers: none")
    return lines


def _lanes(result) -> list[str]:
    lane = result.lane
    lines = [f"lane (measured on {result.options.device}): {lane.name}", *(f"  - {r}" for r in lane.reasons)]
    predicted = result.predicted
    lines.append(f"lane (predicted, {predicted['report']}): {predicted['name']}" if predicted else
                 "lane (predicted): no scan report (run `opscan TARGET` first, or pass --report)")
    verdict = "ACCEPTED" if result.exit_code == 0 else "NOT ACCEPTED"
    lines.append(f"verdict: {verdict} (exit {result.exit_code}, --fail-on-lane {result.options.fail_on_lane})")
    return lines


def comparison_markdown(result) -> str:
    """comparison.md: the per-kind table, the first divergence and every failing tensor."""
    rows = kind_rows((*result.comparisons, *result.round_trip))
    lines = [f"# Acceptance comparison: {result.options.target}", "",
             f"{result.options.device} ({result.options.dtype}) against {result.options.reference} (float32). "
             "rel = ‖target − reference‖₂ / ‖reference‖₂, rms = ‖target − reference‖₂ / √n; a tensor passes when "
             "rms ≤ atol or rel ≤ rtol.", "",
             "| compared | kind | tensors | failed | worst rel | worst rms | worst max abs | rtol | atol |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['pair']} | {r['kind']} | {r['compared']} | {r['failed']} | {_e(r['worst_rel'])} | "
              f"{_e(r['worst_rms'])} | {_e(r['worst_max_abs'])} | {r['rtol']:g} | {r['atol']:g} |" for r in rows]
    lines += ["", *(f"- {line}" for line in _failures(result))]
    failing = [c for c in (*result.comparisons, *result.round_trip) if not c.ok]
    if failing:
        lines += ["", "## Every tensor beyond tolerance", "", *(f"- {c.line()}" for c in failing)]
    return "\n".join(lines) + "\n"


def _e(value: float) -> str:
    return f"{value:.1e}"
