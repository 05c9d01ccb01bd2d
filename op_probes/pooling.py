"""op_probes, pooling family: the indices a max-pool backward reads must come from a max-pool forward
over the same input with the same arguments."""

from __future__ import annotations

import torch

from op_probes import register


@register("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward")
def max_pool_indices(ctx) -> None:
    """Run the forward (on the CPU, float32 copy of `self`) and take its indices."""
    i = ctx.index("indices")
    if i is None or i not in ctx.missing:
        return
    aten = torch.ops.aten
    forward = aten.max_pool3d_with_indices if "3d" in ctx.call.op else aten.max_pool2d_with_indices
    source = ctx.tensors[ctx.index("self")].float()
    args = [ctx.arg(n) for n in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")]
    ctx.fill(i, forward.default(source, *args)[1])
