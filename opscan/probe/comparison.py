"""Probe stage, both sides, and every repro script: THE comparison of a call's outputs with its CPU reference.

One source: the probe worker compares through it (protocol.py's Comparison.of_outputs records the result),
the decision table and the report read its tolerances and the fallback-warning text, and opscan/repro/script.py
copies this file, byte for byte, into every generated repro script (a test holds the copy to this file). So it
is written for both: the standard library at import, torch imported inside the functions that compare tensors,
nothing from opscan, no `from __future__`, and no `__main__` guard.

A floating output is within tolerance when, elementwise, |out - ref| <= atol * max(1, max|ref|) + rtol * |ref|
with (atol, rtol) of the least precise floating dtype the call touches (TOLERANCES, published in docs/measured-mode.md),
NaN and inf in the same places; integer and bool outputs must be equal. Some outputs are compared by their
properties instead (shape, dtype kind, and what the op guarantees): random ops (`nondeterministic_seeded` or in
RANDOM_OPS) and indices that break ties (max-pool indices, sort/topk/argmax positions). Outputs whose content is
undefined — `empty*`, `new_empty*`, `resize_`-, `set_`-style (UNDEFINED_CONTENT) — are compared by shape and
dtype only ("shape"): their memory is whatever the allocator held, on the device and in the reference alike.
"""

import math
import re

TOLERANCES = {  # dtype: (atol, rtol), declared before any comparison
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "float32": (1e-5, 1e-5),
    "complex64": (1e-5, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
PRECISION_ORDER = ("bfloat16", "float16", "complex64", "float32", "complex128", "float64")

# PyTorch's UserWarning when an op runs through the CPU fallback (TORCH_WARN_ONCE at one call site in
# aten/src/ATen/mps/MPSFallback.mm, every release; mps_facts.md §1.4)
FALLBACK_WARNING = re.compile(
    r"The operator '(?P<op>[^']+)' is not currently supported on the MPS backend and will fall back to run on the CPU")

RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "_fused_dropout",
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "normal_",
    "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "multinomial", "poisson",
    "rrelu_with_noise", "_standard_gamma", "binomial", "_sample_dirichlet",
})
# Ops whose output memory holds no defined values (every aten schema of torch 2.14.1 whose name has "empty",
# "resize" or is "set"/"set_", listed from torch._C._jit_get_all_schemas()): empty* allocates without filling;
# resize_ keeps the old elements only while the storage is large enough and leaves the new ones uninitialised;
# set_ points the tensor at a storage (or at none: set_() is empty). Names starting "empty", "new_empty" or
# "_empty" count too, so a later release's empty_* op is never compared by its uninitialised values.
UNDEFINED_CONTENT = frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "empty_quantized", "new_empty", "new_empty_strided",
    "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
    "resize", "resize_", "resize_as", "resize_as_", "_resize_output", "_resize_output_", "resize_as_sparse",
    "resize_as_sparse_", "sparse_resize", "sparse_resize_", "sparse_resize_and_clear", "sparse_resize_and_clear_",
    "set", "set_",
})
UNDEFINED_PREFIXES = ("empty", "new_empty", "_empty")
INDEX_OUTPUTS = {  # op name: output positions holding tie-breaking indices
    "max_pool2d_with_indices": {1}, "max_pool3d_with_indices": {1}, "adaptive_max_pool2d": {1},
    "adaptive_max_pool3d": {1}, "max": {1}, "min": {1}, "sort": {1}, "topk": {1}, "kthvalue": {1}, "mode": {1},
    "median": {1}, "nanmedian": {1}, "cummax": {1}, "cummin": {1}, "argmax": {0}, "argmin": {0},
    "fractional_max_pool2d": {1}, "fractional_max_pool3d": {1},
}


def tolerance_for(dtypes):
    """(dtype, atol, rtol) of the least precise floating dtype among `dtypes`, None when none is floating."""
    for name in PRECISION_ORDER:
        if name in dtypes:
            return (name, *TOLERANCES[name])
    return None


def how_for(func, position):
    """"shape", "properties" or "elementwise": how output `position` of the op `func` (an OpOverload) is compared."""
    import torch

    name = func._schema.name.split("::")[-1]
    if name in UNDEFINED_CONTENT or name.startswith(UNDEFINED_PREFIXES):
        return "shape"
    if name in RANDOM_OPS or torch.Tag.nondeterministic_seeded in func.tags:
        return "properties"
    return "properties" if position in INDEX_OUTPUTS.get(name, ()) else "elementwise"


def references(func):
    """The CPU references to try, in order, as (widen floating inputs, label): float64 first, so rounding of
    the probe's own dtype shows against it — except for an op whose outputs are compared by shape and dtype only,
    whose reference must keep the probe's dtypes (a widened empty_like is float64)."""
    order = ((True, "float64"), (False, "same-dtype"))
    return order[::-1] if how_for(func, 0) == "shape" else order


def compare(func, dtypes, got, ref):
    """(problem or None, max abs error, max rel error, tolerance, how) of the outputs `got` against `ref`
    (both on the CPU), output by output; `dtypes`: the call's tensor dtypes; `how`: "elementwise",
    "properties", "shape", "mixed", or "none" when there was nothing to compare."""
    tol = tolerance_for(set(dtypes) | {dtype_name(v) for v in got})
    if len(got) != len(ref):
        return str(len(got)) + " outputs, reference " + str(len(ref)), 0.0, 0.0, tol, "none"
    worst_abs = worst_rel = 0.0
    hows = []
    for position, (a, b) in enumerate(zip(got, ref)):
        how = how_for(func, position)
        hows.append(how)
        problem, err_abs, err_rel = leaf(a, b, how, tol)
        worst_abs, worst_rel = max(worst_abs, err_abs), max(worst_rel, err_rel)
        if problem:
            return "output " + str(position) + ": " + problem, worst_abs, worst_rel, tol, summary(hows)
    return None, worst_abs, worst_rel, tol, summary(hows)


def summary(hows):
    """One word for how a call's outputs were compared."""
    found = set(hows)
    return "none" if not found else found.pop() if len(found) == 1 else "mixed"


def dtype_name(value):
    """"float32" for a tensor, None for anything else."""
    dtype = getattr(value, "dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else None


def kind(t):
    """"bool", "complex", "float" or "int"."""
    import torch

    if t.dtype == torch.bool:
        return "bool"
    return "complex" if t.is_complex() else "float" if t.is_floating_point() else "int"


def leaf(a, b, how, tol):
    """(problem or None, abs error, rel error) of one output."""
    import torch

    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return type(a).__name__ + " vs reference " + type(b).__name__, 0.0, 0.0
    if not isinstance(a, torch.Tensor):
        return scalar(a, b, tol)
    if tuple(a.shape) != tuple(b.shape):
        return "shape " + str(list(a.shape)) + " vs reference " + str(list(b.shape)), 0.0, 0.0
    if kind(a) != kind(b):
        return "dtype " + str(a.dtype) + " vs reference " + str(b.dtype), 0.0, 0.0
    if how == "shape":
        return (None if a.dtype == b.dtype else "dtype " + str(a.dtype) + " vs reference " + str(b.dtype)), 0.0, 0.0
    if how == "properties":
        return properties(a, b), 0.0, 0.0
    if kind(a) in ("int", "bool"):
        return (None if torch.equal(a, b.to(a.dtype)) else "integer values differ"), 0.0, 0.0
    return close(a, b, tol)


def properties(a, b):
    """What an output compared by its properties must keep: numbers where the reference has numbers, and no
    negative index."""
    import torch

    if kind(a) == "float" and bool(torch.isnan(a).all()) != bool(torch.isnan(b).all()):
        return "all-NaN output where the reference has numbers (or the reverse)"
    if kind(a) == "int" and a.numel() and int(a.min()) < 0:
        return "negative index in an index output"
    return None


def close(a, b, tol):
    """|a - b| <= atol * max(1, max|b|) + rtol * |b| elementwise, NaN and inf in the same places."""
    import torch

    wide = torch.complex128 if a.is_complex() else torch.float64
    a, b = a.to(wide), b.to(wide)
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not (bool(fa.all()) and bool(fb.all())):
        if not torch.equal(torch.isnan(a), torch.isnan(b)):
            return "NaN in different places", math.inf, math.inf
        inf = ~fa & ~torch.isnan(a)
        if not torch.equal(fa, fb) or not torch.equal(a[inf], b[inf]):
            return "inf in different places", math.inf, math.inf
        a, b = torch.where(fa, a, 0), torch.where(fb, b, 0)
    if not a.numel():
        return None, 0.0, 0.0
    diff, ref = (a - b).abs(), b.abs()
    err_abs, err_rel = float(diff.max()), float((diff / ref.clamp_min(1e-30)).max())
    if tol is None:
        return None, err_abs, err_rel
    name, atol, rtol = tol
    scale = max(1.0, float(ref.max()))
    bad = int((diff > ref.mul(rtol).add_(atol * scale)).sum())
    if bad:
        return ("%d of %d values beyond %s tolerance (atol %g×%.3g, rtol %g); max abs error %.3g"
                % (bad, a.numel(), name, atol, scale, rtol, err_abs)), err_abs, err_rel
    return None, err_abs, err_rel


def scalar(a, b, tol):
    """A non-tensor output against the reference's."""
    if a is None or b is None or isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return (None if a == b else repr(a) + " vs reference " + repr(b)), 0.0, 0.0
    a, b = complex(a), complex(b)
    if a == b or (math.isnan(a.real) and math.isnan(b.real)):
        return None, 0.0, 0.0
    err = abs(a - b)
    _, atol, rtol = tol or ("", 0.0, 0.0)
    problem = None if err <= atol * max(1.0, abs(b)) + rtol * abs(b) else repr(a) + " vs reference " + repr(b)
    return problem, err, err / max(abs(b), 1e-30)


def fallback_ops(texts):
    """The ops named by PyTorch's fallback warnings among `texts` (warning messages), in order."""
    return [m.group("op") for w in texts if (m := FALLBACK_WARNING.search(str(w)))]
