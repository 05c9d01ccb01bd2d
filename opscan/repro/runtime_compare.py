"""Repro stage: the comparison half of every generated repro script's runtime, copied into it verbatim (script.py).

Standalone, torch and the standard library only: compare.py's rule, restated. A floating output is within
tolerance when, elementwise, |out - ref| <= atol * max(1, max|ref|) + rtol * |ref| with (atol, rtol) of the
least precise floating dtype the call touches, NaN and inf in the same places; integer and bool outputs
must be equal; outputs listed in the case's "properties" (random ops, empty*, tie-breaking indices) are
compared by their properties only.
"""

import math

import torch

TOLERANCES = {"float64": (1e-7, 1e-7), "complex128": (1e-7, 1e-7), "float32": (1e-5, 1e-5),
              "complex64": (1e-5, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}
PRECISION_ORDER = ("bfloat16", "float16", "complex64", "float32", "complex128", "float64")


def compare(func, case, got, ref):
    """(problem or None, max abs error, max rel error, tolerance) of the outputs against the reference."""
    dtypes = {t["dtype"] for t in case["tensors"]} | {str(v.dtype)[6:] for v in got if isinstance(v, torch.Tensor)}
    tol = next(((d, *TOLERANCES[d]) for d in PRECISION_ORDER if d in dtypes), None)
    if len(got) != len(ref):
        return str(len(got)) + " outputs, reference " + str(len(ref)), 0.0, 0.0, tol
    worst_abs = worst_rel = 0.0
    for position, (a, b) in enumerate(zip(got, ref)):
        problem, err_abs, err_rel = leaf(a, b, properties(case, position), tol)
        worst_abs, worst_rel = max(worst_abs, err_abs), max(worst_rel, err_rel)
        if problem:
            return "output " + str(position) + ": " + problem, worst_abs, worst_rel, tol
    return None, worst_abs, worst_rel, tol


def properties(case, position):
    """True when this output is compared by its properties (random ops, empty*, tie-breaking indices)."""
    how = case.get("properties") or []
    return how == "all" or position in how


def kind(t):
    """"bool", "complex", "float" or "int"."""
    if t.dtype == torch.bool:
        return "bool"
    return "complex" if t.is_complex() else "float" if t.is_floating_point() else "int"


def leaf(a, b, by_properties, tol):
    """(problem or None, abs error, rel error) of one output."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return type(a).__name__ + " vs reference " + type(b).__name__, 0.0, 0.0
    if not isinstance(a, torch.Tensor):
        return scalar(a, b, tol)
    if tuple(a.shape) != tuple(b.shape):
        return "shape " + str(list(a.shape)) + " vs reference " + str(list(b.shape)), 0.0, 0.0
    if kind(a) != kind(b):
        return "dtype " + str(a.dtype) + " vs reference " + str(b.dtype), 0.0, 0.0
    if by_properties:
        if kind(a) == "float" and bool(torch.isnan(a).all()) != bool(torch.isnan(b).all()):
            return "all-NaN output where the reference has numbers (or the reverse)", 0.0, 0.0
        if kind(a) == "int" and a.numel() and int(a.min()) < 0:
            return "negative index in an index output", 0.0, 0.0
        return None, 0.0, 0.0
    if kind(a) in ("int", "bool"):
        return (None if torch.equal(a, b.to(a.dtype)) else "integer values differ"), 0.0, 0.0
    return close(a, b, tol)


def close(a, b, tol):
    """|a - b| <= atol * max(1, max|b|) + rtol * |b| elementwise, NaN and inf in the same places."""
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
        return str(bad) + " of " + str(a.numel()) + " values beyond " + name + " tolerance", err_abs, err_rel
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
