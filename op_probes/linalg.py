"""op_probes, linalg family: positive-definite matrices (Cholesky and friends), always, since seeded
random matrices are not positive definite and the probe would measure that instead of the op."""

from __future__ import annotations

import torch

from op_probes import register


def positive_definite(ctx, i: int) -> None:
    """Replace tensor i (..., n, n) by A Aᵀ + n I, in its recorded dtype, shape and stride."""
    spec = ctx.call.tensors[i]
    n = spec.shape[-1]
    a = torch.randn(*spec.shape, generator=ctx.generator, dtype=torch.float64)
    matrix = a @ a.transpose(-1, -2) + n * torch.eye(n, dtype=torch.float64)
    ctx.fill(i, matrix)


@register("aten::linalg_cholesky_ex", "aten::cholesky_inverse", "aten::linalg_eigh",
          "aten::_linalg_eigh", "aten::linalg_inv_ex", "aten::logdet", "aten::linalg_solve_ex")
def first_matrix(ctx) -> None:
    """The first tensor (self / A) is positive definite."""
    positive_definite(ctx, 0)
