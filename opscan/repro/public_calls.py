"""Repro stage: the public PyTorch call that dispatches an aten overload, for the snippets that lead each ISSUE.md.

`PUBLIC` maps an overload's yaml name to the ways a public call spells it: (number of positional arguments,
template, conditions). A template names the arguments by position (`{0}`, `{1}`, ...); `conditions` are argument
values the spelling needs (`_log_softmax`'s half_to_float False). A recorded call matches an entry when it has no
keyword arguments, as many positional arguments once trailing Nones are dropped, and the conditions hold; anything
else is written `torch.ops.aten.<name>.<overload>(...)` (snippet.py). Every entry is checked to dispatch its overload
on the CPU (tests/test_repro_snippet.py).
"""

from __future__ import annotations

from typing import Any

Spelling = tuple[int, str, dict[int, Any]]


def _s(n: int, template: str, **conditions: Any) -> Spelling:
    return n, template, {int(k.removeprefix("a")): v for k, v in conditions.items()}


def _same(call: str, least: int, most: int, extra: str = "") -> tuple[Spelling, ...]:
    """A public function that takes the overload's arguments in the same order: one spelling per count of
    positional arguments recorded (the dispatcher leaves trailing defaults out); `extra` keyword arguments."""
    return tuple(_s(n, f"{call}({', '.join(f'{{{i}}}' for i in range(n))}{extra})") for n in range(least, most + 1))


PUBLIC: dict[str, tuple[Spelling, ...]] = {
    # elementwise and reductions
    "add.Tensor": (_s(2, "{0} + {1}"),),
    "sub.Tensor": (_s(2, "{0} - {1}"),),
    "mul.Tensor": (_s(2, "{0} * {1}"),),
    "div.Tensor": (_s(2, "{0} / {1}"),),
    "copy_": (_s(2, "{0}.copy_({1})"), _s(3, "{0}.copy_({1}, non_blocking={2})")),
    "erfinv": (_s(1, "torch.erfinv({0})"),),
    "lgamma": (_s(1, "torch.lgamma({0})"),),
    "digamma": (_s(1, "torch.digamma({0})"),),
    "i0": (_s(1, "torch.i0({0})"),),
    "polygamma": (_s(2, "torch.polygamma({0}, {1})"),),
    "special_zeta": (_s(2, "torch.special.zeta({0}, {1})"),),
    "angle": (_s(1, "torch.angle({0})"),),
    "cumsum": (_s(2, "torch.cumsum({0}, {1})"),),
    "cumprod": (_s(2, "torch.cumprod({0}, {1})"),),
    "logcumsumexp": (_s(2, "torch.logcumsumexp({0}, {1})"),),
    "cummax": (_s(2, "torch.cummax({0}, {1})"),),
    "histc": _same("torch.histc", 1, 4),
    "bincount": (_s(1, "torch.bincount({0})"),),
    "_local_scalar_dense": (_s(1, "{0}.item()"),),
    # matrices
    "mm": (_s(2, "{0} @ {1}"),),
    "bmm": (_s(2, "torch.bmm({0}, {1})"),),
    "addmm": (_s(3, "torch.addmm({0}, {1}, {2})"),),
    "_cdist_forward": (_s(3, "torch.cdist({0}, {1}, {2})"),),
    # indexing
    "take": (_s(2, "torch.take({0}, {1})"),),
    "put_": (_s(3, "{0}.put_({1}, {2})"), _s(4, "{0}.put_({1}, {2}, accumulate={3})")),
    "index_put_": (_s(3, "{0}.index_put_({1}, {2})"), _s(4, "{0}.index_put_({1}, {2}, accumulate={3})")),
    "masked_scatter": (_s(3, "{0}.masked_scatter({1}, {2})"),),
    "nonzero": (_s(1, "torch.nonzero({0})"),),
    "searchsorted.Tensor": (_s(2, "torch.searchsorted({0}, {1})"),),
    "sort": _same("torch.sort", 1, 3),
    "topk": _same("torch.topk", 2, 5),
    "kthvalue": _same("torch.kthvalue", 2, 4),
    "embedding_renorm_": (_s(4, "F.embedding({1}, {0}, max_norm={2}, norm_type={3})"),),
    # nn.functional
    "_adaptive_avg_pool2d": (_s(2, "F.adaptive_avg_pool2d({0}, {1})"),),
    "_adaptive_avg_pool3d": (_s(2, "F.adaptive_avg_pool3d({0}, {1})"),),
    "adaptive_max_pool2d": (_s(2, "F.adaptive_max_pool2d({0}, {1}, return_indices=True)"),),
    "avg_pool3d": _same("F.avg_pool3d", 2, 7),
    "max_pool3d_with_indices": _same("F.max_pool3d", 2, 6, ", return_indices=True"),
    "_log_softmax": (_s(3, "F.log_softmax({0}, {1})", a2=False),),
    "_softmax": (_s(3, "F.softmax({0}, {1})", a2=False),),
    "native_layer_norm": (_s(5, "F.layer_norm({0}, {1}, {2}, {3}, {4})"),),
    "native_group_norm": (_s(8, "F.group_norm({0}, {6}, {1}, {2}, {7})"),),
    "upsample_nearest2d": (_s(2, "F.interpolate({0}, size={1})"),),
    "upsample_bilinear2d": (_s(3, "F.interpolate({0}, size={1}, mode='bilinear', align_corners={2})"),),
    "upsample_bicubic2d": (_s(3, "F.interpolate({0}, size={1}, mode='bicubic', align_corners={2})"),),
    "upsample_trilinear3d": (_s(3, "F.interpolate({0}, size={1}, mode='trilinear', align_corners={2})"),),
    "reflection_pad3d": (_s(2, "F.pad({0}, {1}, mode='reflect')"),),
    "replication_pad3d": (_s(2, "F.pad({0}, {1}, mode='replicate')"),),
    "nll_loss_forward": (_s(5, "F.nll_loss({0}, {1}, {2}, ignore_index={4})", a3=1),),
}


def spelling(yaml_name: str, args: list, kwargs: dict) -> str | None:
    """The template for a call of `yaml_name` with these decoded arguments, or None (then torch.ops)."""
    if kwargs:
        return None
    while args and args[-1] is None:
        args = args[:-1]
    for n, template, conditions in PUBLIC.get(yaml_name, ()):
        if n == len(args) and all(args[i] == v for i, v in conditions.items()):
            return template
    return None
