"""Memory stage: the peak of a traced step, per phase and category, and the module holding it (pure).

One sweep over the tracker's events (records.py) keeps the live bytes per category. The headline is
the **steady-state** step: from the second step on, what the first step leaves alive (AdamW's
moments, gradients that are not set to None) already exists while the next step runs, so at each
moment the bytes of those blocks that the first step had not made yet are added. The first step's own
peak is kept beside it.

Categories: the tracker's roles (parameters — with buffers —, inputs, gradients, optimizer state);
every other storage is an activation when the forward or the loss made it, a temporary when backward
or the optimizer did. The bfloat16 figures halve every float32 storage (model and inputs cast).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from opscan.memory.records import CATEGORIES, Block, Timeline

CallPlace = Callable[[int], tuple[str, str, str]]  # call index -> (phase, module, op)
SETUP = ("setup", "", "")
_MADE = {"forward": "activations", "loss": "activations"}


@dataclass(frozen=True)
class Peak:
    """The most bytes alive at once (in a phase, or in the whole step), and where it happened."""

    bytes: int
    phase: str
    module: str
    op: str
    call: int
    categories: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict:
        """JSON form."""
        return {"bytes": self.bytes, "phase": self.phase, "module": self.module, "op": self.op,
                "call": self.call, "categories": dict(self.categories)}


@dataclass(frozen=True)
class Estimate:
    """The step's memory: steady-state peak and per-phase peaks, first-step peak, what stays alive."""

    peak: Peak
    phases: tuple[Peak, ...]
    first_step: int
    end_of_step: tuple[tuple[str, int], ...]
    bf16_peak: int
    unsized: int
    batch: int | None
    optimizer_excess: int = 0  # the optimizer phase's peak above the level it started from (steady)
    state: tuple[int, int] = (0, 0)  # optimizer state alive after the step: bytes, and in bfloat16

    def to_dict(self) -> dict:
        """JSON form."""
        return {"peak": self.peak.to_dict(), "phases": {p.phase: p.to_dict() for p in self.phases},
                "first_step_peak_bytes": self.first_step, "end_of_step": dict(self.end_of_step),
                "bfloat16_peak_bytes": self.bf16_peak, "unsized_tensors": self.unsized, "batch": self.batch}


def category(block: Block, phase: str) -> str:
    """The block's role, else activations (made in forward or loss) or temporaries."""
    if block.role:
        return block.role
    if block.clock < 0:
        return "inputs"
    return _MADE.get(phase, "temporaries")


def without_indices(timeline: Timeline, clocks: frozenset[int]) -> Timeline:
    """The timeline with the int64 storages made by the calls in `clocks` counted as 0 bytes: the CPU's
    max_pool2d_with_indices keeps indices for backward, MPS's own max_pool2d kernel (the lens's
    `mps-max-pool2d` rows) keeps none and recomputes them in its backward."""
    if not clocks:
        return timeline
    blocks = tuple(replace(b, nbytes=0) if b.clock in clocks and b.dtype == "int64" else b for b in timeline.blocks)
    return replace(timeline, blocks=blocks)


def carried(timeline: Timeline) -> frozenset[int]:
    """Blocks made during the step and still alive after it: they exist from the start of the next."""
    return frozenset(i for i in timeline.alive_at_end() if timeline.blocks[i].clock >= 0)


def estimate(timeline: Timeline, where: CallPlace) -> Estimate:
    """Sweep the events once: steady and first-step peaks, per phase, with their categories."""
    blocks = timeline.blocks
    phases = [where(b.clock)[0] if b.clock >= 0 else SETUP[0] for b in blocks]
    cats = [category(b, p) for b, p in zip(blocks, phases)]
    keep = carried(timeline)
    live = dict.fromkeys(CATEGORIES, 0)
    ahead = dict.fromkeys(CATEGORIES, 0)  # carried blocks not made yet
    for i in keep:
        ahead[cats[i]] += blocks[i].nbytes
    best: dict[str, Peak] = {}
    first, start = 0, None  # start: the steady level when the optimizer phase began
    for e in timeline.events:
        i = abs(e) - 1
        if e > 0 and start is None and phases[i] == "optimizer":
            start = sum(live.values()) + sum(ahead.values())
        sign = 1 if e > 0 else -1
        live[cats[i]] += sign * blocks[i].nbytes
        if e < 0:
            continue
        if i in keep:
            ahead[cats[i]] -= blocks[i].nbytes
        total = sum(live.values())
        first = max(first, total)
        steady = total + sum(ahead.values())
        phase = phases[i]
        if phase not in best or steady > best[phase].bytes:
            best[phase] = _peak(steady, blocks[i].clock, where, live, ahead)
    overall = max(best.values(), key=lambda p: p.bytes, default=_peak(0, -1, where, live, ahead))
    end = {c: 0 for c in CATEGORIES}
    for i in timeline.alive_at_end():
        end[cats[i]] += blocks[i].nbytes
    state = [blocks[i] for i in keep if cats[i] == "optimizer_state"]
    return Estimate(peak=overall, phases=tuple(best[p] for p in best if p != SETUP[0]), first_step=first,
                    end_of_step=tuple(end.items()), bf16_peak=max(curve(timeline, bf16=True), default=0),
                    unsized=timeline.unsized, batch=timeline.batch,
                    optimizer_excess=best["optimizer"].bytes - start if start is not None else 0,
                    state=(sum(b.nbytes for b in state), sum(b.bf16_bytes for b in state)))


def _peak(total: int, clock: int, where: CallPlace, live: dict, ahead: dict) -> Peak:
    phase, module, op = where(clock) if clock >= 0 else SETUP
    return Peak(total, phase, module, op, clock, tuple((c, live[c] + ahead[c]) for c in CATEGORIES))


def curve(timeline: Timeline, bf16: bool = False) -> list[int]:
    """Steady-state bytes alive after each allocation, in order (the sizing runs' raw data)."""
    size = (lambda b: b.bf16_bytes) if bf16 else (lambda b: b.nbytes)
    keep = carried(timeline)
    ahead = sum(size(timeline.blocks[i]) for i in keep)
    live, out = 0, []
    for e in timeline.events:
        i = abs(e) - 1
        n = size(timeline.blocks[i])
        if e < 0:
            live -= n
            continue
        live += n
        if i in keep:
            ahead -= n
        out.append(live + ahead)
    return out
