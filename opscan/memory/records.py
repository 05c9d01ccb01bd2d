"""Memory stage: the immutable records the tracker hands to the estimate (no torch import).

A `Timeline` is the step's storages (`Block`s) and the order in which they were allocated and freed.
Event `+i` allocates block `i - 1`, event `-i` frees it; a block never freed is alive at the end of the
step. `clock` is the index of the traced call that was running when the block appeared (-1: before the
step: parameters, buffers, inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("parameters", "inputs", "gradients", "optimizer_state", "activations", "temporaries")
FLOAT32 = "float32"


@dataclass(frozen=True)
class Block:
    """One storage the step held: its size, dtype, device, the call that made it, and its role."""

    nbytes: int
    dtype: str
    device: str
    clock: int
    role: str = ""  # parameters | inputs | gradients | optimizer_state, or "" (decided by the phase)

    @property
    def bf16_bytes(self) -> int:
        """Its bytes with the model and inputs cast to bfloat16 (float32 storages halve)."""
        return self.nbytes // 2 if self.dtype == FLOAT32 else self.nbytes


@dataclass(frozen=True)
class Timeline:
    """What the tracker saw of one step (see the module docstring for `events`)."""

    blocks: tuple[Block, ...]
    events: tuple[int, ...]
    unsized: int = 0  # storages whose size depends on tensor values (fake tensors): not counted
    batch: int | None = None  # the batch the step ran at, when known

    def alive_at_end(self) -> frozenset[int]:
        """Indices of the blocks never freed."""
        alive: set[int] = set()
        for e in self.events:
            (alive.add if e > 0 else alive.discard)(abs(e) - 1)
        return frozenset(alive)
