"""op_probes, losses family: class targets inside [0, C) and valid CTC targets and lengths."""

from __future__ import annotations

import torch

from op_probes import register
from op_probes.indexing import fill_index, shape_of


def classes(ctx) -> int:
    """C: dimension 1 of the input (dimension 0 for an unbatched input)."""
    shape = shape_of(ctx, "self")
    return shape[1] if len(shape) >= 2 else shape[0]


@register("aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward",
          "aten::nll_loss2d_backward", "aten::multi_margin_loss")
def nll(ctx) -> None:
    """target in [0, C)."""
    fill_index(ctx, ctx.index("target"), classes(ctx))


@register("aten::_ctc_loss", "aten::_ctc_loss.Tensor")
def ctc(ctx) -> None:
    """log_probs (T, N, C): targets in [1, C) (0 is the blank); length tensors T and at most T // 2."""
    steps, _, labels = shape_of(ctx, "log_probs")
    i = ctx.index("targets")
    if i is not None and i in ctx.missing:
        ctx.fill(i, torch.randint(1, max(labels, 2), ctx.call.tensors[i].shape, generator=ctx.generator))
    longest = ctx.call.tensors[i].shape[-1] if i is not None and ctx.call.tensors[i].shape else steps
    for name, value in (("input_lengths", steps), ("target_lengths", max(1, min(longest, steps // 2)))):
        j = ctx.index(name)
        if j is not None and j in ctx.missing:
            ctx.fill(j, torch.full(ctx.call.tensors[j].shape, value))
