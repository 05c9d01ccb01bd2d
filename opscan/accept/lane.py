"""Accept stage: the measured lane of an acceptance run, from its failures and where things ran (no torch).

The contract's lanes, decided on what the run on the target device did, in this order:

- `linux-gpu-first`: any comparison failure (first divergence, round trip), with those lines as reasons; or
  the CPU fallback copied more bytes per training iteration (forward .. optimizer phases only) than the
  step's parameters and activations (`step_bytes`);
- `dual-track`: any CPU fallback; any bulk host move inside forward, loss, backward or optimizer (the model
  moves work to the CPU: `.cpu()`, `.to('cpu')`, `.tolist()`, printing, `.numpy()`, a copy to the host) —
  reads of one value (`.item()`, `bool(t)`) are syncs, reported but not deciding, and so are copies to the
  device; a parameter or an optimizer state tensor off the target device;
- `mac-first` otherwise: "ran entirely on <device>, N iterations, within tolerance".

The last reason always says which device was measured: on cpu or cuda the lane is what the step did there,
not a measurement of MPS. Reasons are graph.lanes.Reason data, as the scan's: comparison failures are kind
`comparison`, fallbacks `row` (the op that fell back), host moves and the heavy-fallback total `transfer`,
misplaced tensors `placement`, the device line `device`; the lane's source is `measured`.
"""

from __future__ import annotations

from collections import defaultdict

from opscan.accept.placement import STEP_PHASES, Placement, Transfer
from opscan.graph.lanes import Lane, LaneName, Reason, ReasonKind
from opscan.units import human_bytes
from opscan.verdict import Source

_SHOWN = 5  # names listed per misplaced group, fallbacks per heavy reason
_KINDS = {"parameter": "parameter", "optimizer_state": "optimizer state tensor"}


def measured_lane(failures: tuple[str, ...], placement: Placement, step_bytes: int) -> Lane:
    """failures: one line per comparison failure (first divergence, round trip); step_bytes: params+activations."""
    note = Reason(ReasonKind.DEVICE, _measured_on(placement.device))
    heavy = _heavy_fallback(placement, step_bytes)
    if failures or heavy:
        failed = (Reason(ReasonKind.COMPARISON, f) for f in failures)
        return Lane(LaneName.LINUX_GPU_FIRST, (*failed, *heavy, note), Source.MEASURED)
    n = max(placement.iterations, 1)
    dual = (*map(_fallback_reason, placement.fallbacks), *(_move_reason(t, n) for t in host_moves(placement)),
            *_misplaced_reasons(placement))
    if dual:
        return Lane(LaneName.DUAL_TRACK, (*dual, note), Source.MEASURED)
    ran = Reason(ReasonKind.ROW, f"ran entirely on {placement.device}, {n} iteration{'s' * (n != 1)}, within "
                                 "tolerance")
    return Lane(LaneName.MAC_FIRST, (ran, note), Source.MEASURED)


def host_moves(placement: Placement) -> tuple[Transfer, ...]:
    """The bulk moves to the host inside the step's phases (requested ones on a CPU target included)."""
    return tuple(t for t in placement.transfers
                 if t.phase in STEP_PHASES and not t.sync_read and t.destination == "cpu")


def fallback_bytes_per_iteration(placement: Placement) -> int:
    """What the CPU fallback copied, both directions, per training iteration on average: the step's phases
    only (eval and the checkpoint round trip's extra steps are recorded per phase but not counted here)."""
    return sum(f.step_bytes for f in placement.fallbacks) // max(placement.iterations, 1)


def _heavy_fallback(placement: Placement, step_bytes: int) -> tuple[Reason, ...]:
    moved = fallback_bytes_per_iteration(placement)
    if step_bytes <= 0 or moved <= step_bytes:
        return ()
    top = sorted(placement.fallbacks, key=lambda f: -f.step_bytes)[:_SHOWN]
    head = (f"the CPU fallback copied {human_bytes(moved)} per iteration, more than the step's parameters and "
            f"activations together ({human_bytes(step_bytes)})")
    return (Reason(ReasonKind.TRANSFER, head), *map(_fallback_reason, top))


def _fallback_reason(f) -> Reason:
    where = ", ".join(m or "outside the model" for m in f.modules)
    return Reason(ReasonKind.ROW, f"{f.op} fell back to the CPU {f.count}× in {'/'.join(f.phases)} ({where}), "
                                  f"copying {human_bytes(f.bytes)} — {f.evidence}")


def _move_reason(t: Transfer, iterations: int) -> Reason:
    module = t.module or "code outside the model"
    size = f"{human_bytes(t.bytes / iterations)} per iteration ({t.count} calls in {iterations} iterations)"
    if t.moved_here:
        return Reason(ReasonKind.TRANSFER, f"{module} moves {size} from {t.source} to the host with {t.op} in "
                                           f"{t.phase}")
    return Reason(ReasonKind.TRANSFER, f"{module} asks for {t.op} of {size} in {t.phase}: no copy on the CPU, a "
                                       "device-to-host copy and a sync on an accelerator")


def _misplaced_reasons(placement: Placement) -> tuple[Reason, ...]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for m in placement.misplaced:
        groups[(m["kind"], m["device"])].append(m)
    reasons = []
    for (kind, device), items in groups.items():
        names = ", ".join(m["name"] for m in items[:_SHOWN]) + (", ..." if len(items) > _SHOWN else "")
        what = _KINDS[kind] + ("s" if len(items) != 1 else "")
        reasons.append(Reason(ReasonKind.PLACEMENT, f"{len(items)} {what} on {device}, not {placement.device}: "
                                                    f"{names} ({human_bytes(sum(m['bytes'] for m in items))})"))
    return tuple(reasons)


def _measured_on(device: str) -> str:
    if device.startswith("mps"):
        return f"measured on {device}"
    return (f"measured on {device}, not on a Mac: the lane says how the step ran on {device}; "
            "accept it on a Mac (mps) for MPS itself")
