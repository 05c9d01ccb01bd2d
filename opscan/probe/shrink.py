"""Probe stage: cap a probe's shapes (`--max-elements`) while keeping the call consistent.

Sizes are shrunk by value, not by tensor: every dimension of size s (and every integer argument equal
to s, such as a view's target size or embedding_dense_backward's num_weights) becomes ceil(s/2),
repeatedly, largest first, until no tensor has more than `max_elements` elements. Dimensions of at
most MIN_SIZE are never touched (kernel sizes, heads, small batches). Strides are rebuilt dense in
the recorded order (stride 0 stays 0); recorded integer values are dropped and remade by op_probes.

A call's feed (the forward that makes its saved inputs: feeds.py) is shrunk by the same mapping, so the two stay
consistent. The parent proposes a mapping (`cap`) after checking the capped call (and feed) on meta tensors; the worker
applies it (`apply`) only if the capped call's CPU reference runs, else it probes the full shapes —
meta kernels accept some inconsistent shapes (a convolution's grad_output) that real kernels refuse.
A call with recorded integer values and no op_probes builder to remake them is never capped.
"""

from __future__ import annotations

import math
from dataclasses import replace

from opscan.probe.protocol import ProbeCall, TensorSpec

MIN_SIZE = 8


def numel(shape) -> int:
    """Elements of a shape."""
    return math.prod(shape) if shape else 1


def cap(call: ProbeCall, max_elements: int | None, has_builder) -> ProbeCall:
    """The call with a shrink mapping proposed (or unchanged, with a note saying why not).
    `has_builder(op)` says whether op_probes can remake integer values."""
    everything = call.tensors + (call.feed.tensors if call.feed else ())
    if not max_elements or not call.tensors or max(numel(t.shape) for t in everything) <= max_elements:
        return call
    if any(t.values is not None for t in call.tensors) and not has_builder(call.op) or \
            call.feed and any(t.values is not None for t in call.feed.tensors) and not has_builder(call.feed.op):
        return replace(call, note="full shapes: its recorded integer values could not be remade for smaller shapes")
    mapping = _mapping(everything, max_elements)
    if not mapping:
        return replace(call, note=f"full shapes: no dimension above {MIN_SIZE} to shrink")
    capped = apply(replace(call, shrink=mapping))
    problem = check_on_meta(capped) or (check_on_meta(capped.feed) if capped.feed else None)
    if problem:
        return replace(call, note=f"full shapes: the capped call fails on meta tensors ({problem})")
    return replace(call, shrink=mapping)


def apply(call: ProbeCall) -> ProbeCall:
    """The capped call: shapes, strides and integer arguments mapped, integer values dropped."""
    mapping = call.shrink or {}
    feed = call.feed and replace(call.feed, tensors=tuple(_shrunk(t, mapping) for t in call.feed.tensors),
                                 spec=_ints(call.feed.spec, mapping))
    return replace(call, tensors=tuple(_shrunk(t, mapping) for t in call.tensors), spec=_ints(call.spec, mapping),
                   shrink=None, note="shapes capped from " + "; ".join(str(list(t.shape)) for t in call.tensors),
                   feed=feed)


def _mapping(tensors, max_elements: int) -> dict[int, int]:
    mapping: dict[int, int] = {}
    while True:
        shapes = [tuple(mapping.get(s, s) for s in t.shape) for t in tensors]
        if max(numel(s) for s in shapes) <= max_elements:
            return mapping
        big = [s for shape in shapes for s in shape if s > MIN_SIZE]
        if not big:
            return {}
        largest = max(big)
        for original, now in list(mapping.items()) + [(largest, largest)]:
            if now == largest:
                mapping[original] = math.ceil(largest / 2)


def _shrunk(t: TensorSpec, mapping: dict[int, int]) -> TensorSpec:
    shape = tuple(mapping.get(s, s) for s in t.shape)
    order = sorted(range(len(shape)), key=lambda d: (t.stride[d], -d))
    stride, step = [0] * len(shape), 1
    for d in order:
        if t.stride[d] == 0:
            continue
        stride[d] = step
        step *= max(shape[d], 1)
    return TensorSpec(t.dtype, shape, tuple(stride), None, 0, t.host)  # a capped view starts its own storage


def _ints(spec, mapping: dict[int, int]):
    if isinstance(spec, bool):
        return spec
    if isinstance(spec, int):
        return mapping.get(spec, spec)
    if isinstance(spec, list):
        return [_ints(v, mapping) for v in spec]
    if isinstance(spec, dict):
        return spec if "t" in spec else {k: _ints(v, mapping) for k, v in spec.items()}
    return spec


def check_on_meta(call) -> str | None:
    """Run the call (a ProbeCall or a Feed) on meta tensors; the error text when it fails, else None."""
    import torch

    from opscan.probe import replay
    from opscan.probe.rebuild import decode_argument

    try:
        func = replay.resolve(call.op)
        tensors = [torch.empty_strided(t.shape, t.stride, dtype=getattr(torch, t.dtype), device="meta")
                   for t in call.tensors]
        args = [decode_argument(a, tensors, "meta", 0) for a in call.spec.get("args", [])]
        kwargs = {k: decode_argument(v, tensors, "meta", 0) for k, v in call.spec.get("kwargs", {}).items()}
        func(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure means: do not cap this call
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
