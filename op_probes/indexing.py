"""op_probes, indexing family: indices inside the dimension they index (embedding, gather, scatter,
index_select, index/index_put). Recorded values are kept; only missing ones are made."""

from __future__ import annotations

import torch

from op_probes import register


def fill_index(ctx, i: int | None, high: int) -> None:
    """Random indices in [0, high) for tensor i, unless it has recorded values."""
    if i is None or i not in ctx.missing:
        return
    spec = ctx.call.tensors[i]
    ctx.fill(i, torch.randint(0, max(high, 1), spec.shape, generator=ctx.generator))


def shape_of(ctx, name: str) -> tuple[int, ...]:
    """Recorded shape of the tensor argument `name`."""
    return ctx.call.tensors[ctx.index(name)].shape


def dim_size(ctx, tensor: str, dim_arg: str = "dim") -> int:
    """Size of `tensor` along the (possibly negative) dimension argument."""
    shape = shape_of(ctx, tensor)
    if not shape:
        return 1
    return shape[ctx.arg(dim_arg, 0) % len(shape)]


@register("aten::embedding")
def embedding(ctx) -> None:
    """indices in [0, num_embeddings)."""
    fill_index(ctx, ctx.index("indices"), shape_of(ctx, "weight")[0])


@register("aten::embedding_dense_backward")
def embedding_backward(ctx) -> None:
    """indices in [0, num_weights)."""
    fill_index(ctx, ctx.index("indices"), int(ctx.arg("num_weights")))


@register("aten::gather", "aten::scatter.src", "aten::scatter.value", "aten::scatter_add",
          "aten::scatter_reduce.two", "aten::index_select", "aten::index_add", "aten::scatter_.src",
          "aten::scatter_add_", "aten::index_fill.int_Scalar", "aten::index_copy")
def along_dim(ctx) -> None:
    """index in [0, self.size(dim))."""
    fill_index(ctx, ctx.index("index"), dim_size(ctx, "self"))


@register("aten::index.Tensor", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_")
def advanced(ctx) -> None:
    """The k-th index tensor indexes dimension k of self; bool masks get random bits."""
    shape = shape_of(ctx, "self")
    for k, entry in enumerate(ctx.arg("indices") or []):
        if isinstance(entry, dict) and "t" in entry and k < len(shape):
            high = 2 if ctx.call.tensors[entry["t"]].dtype == "bool" else shape[k]
            fill_index(ctx, entry["t"], high)
