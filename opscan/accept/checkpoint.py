"""Accept stage (checkpoint): save on the target, reload with weights_only=True, continue one step.

After the last iteration and the evaluation, the target's `model.state_dict()` and
`optimizer.state_dict()` are saved with `torch.save` (one file, `{"model": ..., "optimizer": ...}`).
A FRESH model (the factory called again with the same seed, copied the same way) is loaded from those
bytes with `torch.load(weights_only=True)` on the target and on the reference, with a fresh optimizer
loading its state. Compared, on both: the reloaded state (every parameter and buffer, non-persistent
buffers included) against the state that was saved, and one more step of the reloaded model against
one more step of the original target run.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import torch

from opscan.accept.compare import Comparison, compare_pair, missing
from opscan.accept.run import Captured, Session, prepare, state_tensors, train_iteration
from opscan.accept.spec import AcceptSpec


class NullRecorder:
    """A recorder that records nothing (the continued steps are not the run being placed)."""

    def phase(self, name: str, iteration: int):
        """A no-op phase."""
        import contextlib

        return contextlib.nullcontext()

    def census(self, *args) -> None:
        """Nothing to count."""


@dataclass(frozen=True)
class Continued:
    """One side of the round trip: the reloaded state and its next step (or why it could not load)."""

    side: str  # "target" | "reference" | "original"
    captured: tuple[Captured, ...]
    error: str = ""


def save(session: Session) -> bytes:
    """torch.save of the model's and the optimizer's state dicts, as bytes (the CLI writes them)."""
    buffer = io.BytesIO()
    torch.save({"model": session.model.state_dict(), "optimizer": session.optimizer.state_dict()}, buffer)
    return buffer.getvalue()


def continue_original(session: Session, iteration: int) -> Continued:
    """The saved state, then one more step of the original run."""
    saved = state_tensors(session.model, iteration, "reload")
    return Continued("original", (*saved, *train_iteration(session, iteration, NullRecorder(), False)))


def reload_and_continue(blob: bytes, fresh: Session, side: str, iteration: int) -> Continued:
    """Load the checkpoint into a fresh session (weights_only=True), then one more step."""
    try:
        state = torch.load(io.BytesIO(blob), weights_only=True, map_location=fresh.device)
        fresh.model.load_state_dict(state["model"])
        fresh.optimizer.load_state_dict(state["optimizer"])
    except Exception as exc:  # noqa: BLE001 - a checkpoint that does not reload is a finding
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return Continued(side, (), f"{type(exc).__name__}: {first}")
    reloaded = state_tensors(fresh.model, iteration, "reload")
    return Continued(side, (*reloaded, *train_iteration(fresh, iteration, NullRecorder(), False)))


def fresh_session(target, fresh_cpu_model: torch.nn.Module, device: str, dtype: str) -> Session:
    """A session around a copy of the freshly built model (no perturbation, dropout off)."""
    return prepare(target, device, dtype, cpu_model=fresh_cpu_model)


def compare_round_trip(original: Continued, reloaded: tuple[Continued, ...], dtype: str, spec: AcceptSpec,
                       persistent: set[str]) -> tuple[Comparison, ...]:
    """Each reloaded side against the original: the reloaded state, then the continued step — over the union
    of both sides' tensors (one that a side lacks fails, named)."""
    found: list[Comparison] = []
    for side in reloaded:
        pair = f"reload@{side.side}-vs-original"
        if side.error:
            found.append(Comparison(0, "reload", "(checkpoint)", "(model)", math.inf, math.inf, math.inf, 0.0, 0.0,
                                    False, pair, f"reloading failed: {side.error}"))
            continue
        found += _compare_side(original, side, dtype, spec, persistent, pair)
    return tuple(found)


def _compare_side(original: Continued, side: Continued, dtype: str, spec: AcceptSpec, persistent: set[str],
                  pair: str) -> list[Comparison]:
    mine = {(c.kind, c.name): c for c in original.captured}
    theirs = {(c.kind, c.name): c for c in side.captured}
    found = []
    for c in side.captured:
        other = mine.get((c.kind, c.name))
        if other is None:
            found.append(missing(c, f"missing on the original run (the reloaded {side.side} has it)", pair))
            continue
        result = compare_pair(c.iteration, c.kind, c.name, c.module or "(model)", c.tensor, other.tensor,
                              spec.tolerance(dtype, c.kind), pair)
        if c.kind == "reload" and c.name not in persistent:
            result = _note(result, "not in the state dict (a non-persistent buffer): the reload keeps the "
                                   "factory's value — register it with persistent=True")
        found.append(result)
    found += [missing(c, f"missing on the reloaded {side.side} (the original run has it)", pair)
              for key, c in mine.items() if key not in theirs]
    return found


def _note(c: Comparison, note: str) -> Comparison:
    from dataclasses import replace

    return replace(c, note=note) if not c.ok else c
