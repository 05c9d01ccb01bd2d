"""op_probes, elementwise family: positive inputs for ops whose domain is positive (sqrt, rsqrt, log),
so that their comparison is about values and not about NaNs in the same places."""

from __future__ import annotations

from op_probes import register


@register("aten::sqrt", "aten::rsqrt", "aten::log", "aten::log2", "aten::log10", "aten::sqrt_",
          "aten::rsqrt_", "aten::log_")
def positive(ctx) -> None:
    """|x| + 0.5 for the first (floating) input."""
    ctx.fill(0, ctx.tensors[0].abs() + 0.5)
