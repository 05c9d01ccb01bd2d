"""Knowledge stage: checks for hard errors that MPS kernels raise for some shapes or arguments.

facts.yaml's `shape_errors` name a check here by its key in `CHECKS`. A check reads the call's
`args_note` and returns True when the MPS kernel would raise, False when it would not, and None
when the note lacks what it needs (then the classifier decides without it).

`args_note` keys (all optional; a check uses only its own):

* ``"input_spatial"``: ``[H, W]``, the last two sizes of the pooled input (``self``);
* ``"output_size"``: ``[oH, oW]``, the pooled output's last two sizes.

`note_from_shapes` builds that note from the tensor shapes a trace records, so callers need not
know each op's argument order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opscan.opkey import OpKey

Note = dict


def _pair(note: Note | None, key: str) -> tuple[int, int] | None:
    """note[key] as two positive ints, or None."""
    value = (note or {}).get(key)
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    if not all(isinstance(v, int) and v > 0 for v in value):
        return None
    return int(value[0]), int(value[1])


def adaptive_pool_divisible(note: Note | None) -> bool | None:
    """AdaptivePooling.mm: avg pooling needs input % output == 0 when shrinking (per dimension
    pair), output % input == 0 when growing; otherwise TORCH_CHECK_NOT_IMPLEMENTED raises."""
    isize, osize = _pair(note, "input_spatial"), _pair(note, "output_size")
    if isize is None or osize is None:
        return None
    if isize[0] >= osize[0]:
        return any(i % o for i, o in zip(isize, osize))
    return any(o % i for i, o in zip(isize, osize))


def adaptive_pool_same_direction(note: Note | None) -> bool | None:
    """AdaptivePooling.mm: height and width must both shrink (or stay) or both grow."""
    isize, osize = _pair(note, "input_spatial"), _pair(note, "output_size")
    if isize is None or osize is None:
        return None
    shrink = isize[0] >= osize[0] and isize[1] >= osize[1]
    grow = isize[0] <= osize[0] and isize[1] <= osize[1]
    return not (shrink or grow)


CHECKS: dict[str, Callable[[Note | None], bool | None]] = {
    "adaptive_pool_divisible": adaptive_pool_divisible,
    "adaptive_pool_same_direction": adaptive_pool_same_direction,
}

# Which recorded tensor carries the pooled input and which the pooled output:
# ("in", i) = the i-th tensor input, ("out", i) = the i-th tensor output.
_POOL_TENSORS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "_adaptive_avg_pool2d": (("in", 0), ("out", 0)),
    "adaptive_avg_pool2d": (("in", 0), ("out", 0)),
    "adaptive_max_pool2d": (("in", 0), ("out", 0)),
    "_adaptive_avg_pool2d_backward": (("in", 1), ("in", 0)),  # (grad_output, self)
    "adaptive_max_pool2d_backward": (("in", 1), ("in", 0)),  # (grad_output, self, indices)
}


def note_from_shapes(
    op: OpKey, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> Note | None:
    """The args_note of one call from its tensor input and output shapes, or None if no
    shape rule concerns `op` (or the shapes are too short)."""
    where = _POOL_TENSORS.get(op.name) if op.namespace == "aten" else None
    if where is None:
        return None
    shapes = {"in": inputs, "out": outputs}
    try:
        src, dst = (shapes[kind][i] for kind, i in where)
    except IndexError:
        return None
    if len(src) < 2 or len(dst) < 2:
        return None
    return {"input_spatial": list(src[-2:]), "output_size": list(dst[-2:])}
