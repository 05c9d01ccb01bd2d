"""Probe stage (worker side): compare a probe's outputs with the reference run, tolerances declared first.

The reference is the same call on the CPU with floating inputs cast to float64 (complex to
complex128); when the op refuses float64 it is the same call on the CPU in the probe's dtypes
(`reference: "same-dtype"`). A floating output is within tolerance when, elementwise,

    |out - ref| <= atol * max(1, max|ref|) + rtol * |ref|

with (atol, rtol) of the least precise floating dtype the call touches (TOLERANCES, published in the
README); NaN and ±inf must sit in the same places. Integer and bool outputs must be equal.
Some outputs are compared by their properties instead (shape, dtype kind, and what the op
guarantees): random ops (`nondeterministic_seeded` or in RANDOM_OPS), `empty*` outputs, and indices
that break ties (max-pool indices, sort/topk/argmax positions).
"""

from __future__ import annotations

import math

import torch

from opscan.probe.protocol import Comparison

TOLERANCES: dict[str, tuple[float, float]] = {  # dtype: (atol, rtol), declared before any comparison
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "float32": (1e-5, 1e-5),
    "complex64": (1e-5, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
PRECISION_ORDER = ("bfloat16", "float16", "complex64", "float32", "complex128", "float64")
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "_fused_dropout",
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "normal_",
    "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "multinomial", "poisson",
    "rrelu_with_noise", "_standard_gamma", "binomial", "_sample_dirichlet",
})
EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
                       "_empty_affine_quantized"})
INDEX_OUTPUTS = {  # op name: output positions holding tie-breaking indices
    "max_pool2d_with_indices": {1}, "max_pool3d_with_indices": {1}, "adaptive_max_pool2d": {1},
    "adaptive_max_pool3d": {1}, "max": {1}, "min": {1}, "sort": {1}, "topk": {1}, "kthvalue": {1}, "mode": {1},
    "median": {1}, "nanmedian": {1}, "cummax": {1}, "cummin": {1}, "argmax": {0}, "argmin": {0},
    "fractional_max_pool2d": {1}, "fractional_max_pool3d": {1},
}


def tolerance_for(dtypes) -> tuple[str, float, float] | None:
    """(dtype, atol, rtol) of the least precise floating dtype among `dtypes`, None when none is floating."""
    for name in PRECISION_ORDER:
        if name in dtypes:
            return (name, *TOLERANCES[name])
    return None


def how_for(func, position: int) -> str:
    """"properties" or "elementwise" for one output of an op."""
    name = func._schema.name.split("::")[-1]
    if name in RANDOM_OPS or name in EMPTY_OPS or torch.Tag.nondeterministic_seeded in func.tags:
        return "properties"
    return "properties" if position in INDEX_OUTPUTS.get(name, ()) else "elementwise"


def compare(func, got: list, ref: list, dtypes, reference: str) -> Comparison:
    """Compare the probe's outputs `got` with `ref` (both on the CPU), leaf by leaf."""
    if len(got) != len(ref):
        return Comparison("none", False, reference=reference, detail=f"{len(got)} outputs, reference {len(ref)}")
    tol = tolerance_for(set(dtypes) | {_dtype(v) for v in got})
    worst_abs = worst_rel = 0.0
    hows = set()
    for position, (a, b) in enumerate(zip(got, ref)):
        how = how_for(func, position)
        hows.add(how)
        problem, err_abs, err_rel = _leaf(a, b, how, tol)
        worst_abs, worst_rel = max(worst_abs, err_abs), max(worst_rel, err_rel)
        if problem:
            return Comparison(_how(hows), False, _finite(worst_abs), _finite(worst_rel), reference,
                              f"output {position}: {problem}")
    return Comparison(_how(hows) if got else "none", True, _finite(worst_abs), _finite(worst_rel), reference)


def _how(hows: set) -> str:
    return hows.pop() if len(hows) == 1 else "mixed"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _dtype(value) -> str | None:
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else None


def _leaf(a, b, how: str, tol) -> tuple[str | None, float, float]:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return f"{type(a).__name__} vs reference {type(b).__name__}", 0.0, 0.0
    if not isinstance(a, torch.Tensor):
        return _scalar(a, b, tol)
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {list(a.shape)} vs reference {list(b.shape)}", 0.0, 0.0
    if _kind(a) != _kind(b):
        return f"dtype {a.dtype} vs reference {b.dtype}", 0.0, 0.0
    if how == "properties":
        return _properties(a, b), 0.0, 0.0
    if _kind(a) in ("int", "bool"):
        equal = bool(torch.equal(a, b.to(a.dtype)))
        return (None if equal else "integer values differ"), 0.0, 0.0
    return _close(a, b, tol)


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "float" if t.is_floating_point() else "int"


def _properties(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if _kind(a) == "float" and bool(torch.isnan(a).all()) != bool(torch.isnan(b).all()):
        return "all-NaN output where the reference has numbers (or the reverse)"
    if _kind(a) == "int" and a.numel() and int(a.min()) < 0:
        return "negative index in an index output"
    return None


def _close(a: torch.Tensor, b: torch.Tensor, tol) -> tuple[str | None, float, float]:
    wide = torch.complex128 if a.is_complex() else torch.float64
    a, b = a.to(wide), b.to(wide)
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not (bool(finite_a.all()) and bool(finite_b.all())):
        problem = _non_finite(a, b, finite_a, finite_b)
        if problem:
            return problem, math.inf, math.inf
        a, b = torch.where(finite_a, a, 0), torch.where(finite_b, b, 0)
    if not a.numel():
        return None, 0.0, 0.0
    diff, ref = (a - b).abs(), b.abs()
    err_abs = float(diff.max())
    err_rel = float((diff / ref.clamp_min(1e-30)).max())
    if tol is None:
        return None, err_abs, err_rel
    name, atol, rtol = tol
    scale = max(1.0, float(ref.max()))
    bad = int((diff > ref.mul(rtol).add_(atol * scale)).sum())
    if bad:
        return (f"{bad} of {a.numel()} values beyond {name} tolerance (atol {atol:g}×{scale:.3g}, rtol {rtol:g}); "
                f"max abs error {err_abs:.3g}"), err_abs, err_rel
    return None, err_abs, err_rel


def _non_finite(a, b, finite_a, finite_b) -> str | None:
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return "NaN in different places"
    inf = ~finite_a & ~torch.isnan(a)
    if not torch.equal(finite_a, finite_b) or not torch.equal(a[inf], b[inf]):
        return "inf in different places"
    return None


def _scalar(a, b, tol) -> tuple[str | None, float, float]:
    if a is None or b is None or isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return (None if a == b else f"{a!r} vs reference {b!r}"), 0.0, 0.0
    a, b = complex(a), complex(b)
    if a == b or (math.isnan(a.real) and math.isnan(b.real)):
        return None, 0.0, 0.0
    err = abs(a - b)
    _, atol, rtol = tol or ("", 0.0, 0.0)
    if err > atol * max(1.0, abs(b)) + rtol * abs(b):
        return f"{a} vs reference {b}", err, err / max(abs(b), 1e-30)
    return None, err, err / max(abs(b), 1e-30)
