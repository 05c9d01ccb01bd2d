"""Accept stage (spec): the tolerances declared before looking, the seed and the run's choices.

Every compared tensor is judged on the L2 norm of its difference: `abs` is the root-mean-square
difference (‖target − reference‖₂ / √n) and `rel` is ‖target − reference‖₂ / ‖reference‖₂; a tensor
passes when `abs ≤ atol` or `rel ≤ rtol` (a non-finite value where the reference is finite always
fails). The norm, not the largest element, because Adam and AdamW divide each gradient by its own
running magnitude: a gradient that is rounding noise on both devices (a key bias under softmax, a
weight before BatchNorm at batch 2) becomes a full ±lr update whose sign differs between devices,
so a handful of elements of a parameter legitimately differ by 2·lr after a step.

Tolerances are per dtype of the TARGET (the reference runs float32) and per compared kind; the
defaults below are published in docs/accept.md and can be overridden by a small YAML spec:

    seed: 0
    iterations: 3
    tolerances:
      float32:
        output: {rtol: 1.0e-3, atol: 1.0e-5}
        parameter: {rtol: 1.0e-3}
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from opscan.errors import OpscanError

# compared kinds, in the order they are compared within one iteration
KINDS = ("initial", "output", "loss", "gradient", "parameter", "buffer", "eval", "reload")
DTYPES = ("float32", "float16", "bfloat16")
ITERATIONS_DEFAULT = 3


class SpecError(OpscanError):
    """The YAML spec is missing, malformed or names unknown keys."""


@dataclass(frozen=True)
class Tolerance:
    """Pass when the RMS difference ≤ atol or the norm-relative difference ≤ rtol."""

    atol: float
    rtol: float

    def to_dict(self) -> dict[str, float]:
        """YAML/JSON form."""
        return {"atol": self.atol, "rtol": self.rtol}


def _table(initial: float, activations: tuple[float, float], gradient: tuple[float, float],
           parameter: tuple[float, float], buffer: tuple[float, float]) -> dict[str, Tolerance]:
    """One dtype's row: (rtol, atol) pairs for outputs/loss/eval, gradients, parameters, buffers."""
    act, grad, par, buf = (Tolerance(atol=a, rtol=r) for r, a in (activations, gradient, parameter, buffer))
    exact = Tolerance(atol=0.0, rtol=initial)
    return {"initial": exact, "output": act, "loss": act, "gradient": grad, "parameter": par, "buffer": buf,
            "eval": act, "reload": exact}


# (rtol, atol) per kind. A copy is exact (initial, reload: the cast alone for float16/bfloat16, 2^-11 / 2^-8).
# float32 on cuda against the cpu with TF32 off differs by float32 rounding, which training compounds: measured
# as float32 against float64 on the CPU, 3 iterations (docs/accept.md), the worst were outputs 3.3e-4
# rel, parameters 3.4e-5 rms (Adam's ±lr on noise gradients: 2.9e-3 max abs), BatchNorm running means 4e-4 rms
# on examples/cnn.py (batch 2); resnet18 at batch 4 and BERT 5-1000x below that. float16/bfloat16: 10x the
# cast's own error for activations.
DEFAULT_TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "float32": _table(1e-6, (1e-3, 1e-5), (1e-3, 1e-6), (1e-3, 1e-4), (1e-3, 1e-3)),
    "float16": _table(1e-3, (1e-2, 1e-3), (1e-2, 1e-5), (1e-2, 1e-3), (1e-2, 1e-2)),
    "bfloat16": _table(8e-3, (5e-2, 1e-2), (5e-2, 1e-4), (5e-2, 1e-2), (5e-2, 5e-2)),
}


@dataclass(frozen=True)
class AcceptSpec:
    """What is declared before the run: seed, iterations and tolerances (per target dtype, per kind)."""

    seed: int = 0
    iterations: int = ITERATIONS_DEFAULT
    tolerances: dict[str, dict[str, Tolerance]] = field(default_factory=lambda: DEFAULT_TOLERANCES)
    source: str = "defaults"

    def tolerance(self, dtype: str, kind: str) -> Tolerance:
        """The tolerance of one compared kind for a target running in `dtype`."""
        return self.tolerances[dtype][kind]

    def to_dict(self) -> dict[str, Any]:
        """The effective spec (what spec.yaml in the package holds)."""
        return {"seed": self.seed, "iterations": self.iterations, "source": self.source,
                "tolerances": {d: {k: t.to_dict() for k, t in kinds.items()} for d, kinds in self.tolerances.items()}}


def parse_spec(data: Any, source: str, base: AcceptSpec | None = None) -> AcceptSpec:
    """Validate a loaded YAML document and merge it over `base` (default: the published defaults)."""
    base = base or AcceptSpec()
    if data is None:
        return replace(base, source=source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a mapping (seed, iterations, tolerances) — see "
                        "docs/accept.md")
    _only(data, ("seed", "iterations", "tolerances", "choices"), source, "top level")  # choices: a record only
    seed = _integer(data.get("seed", base.seed), f"{source}: seed", 0)
    iterations = _integer(data.get("iterations", base.iterations), f"{source}: iterations", 1)
    tolerances = _merge_tolerances(base.tolerances, data.get("tolerances") or {}, source)
    return AcceptSpec(seed=seed, iterations=iterations, tolerances=tolerances, source=source)


def load_spec(path: str) -> AcceptSpec:
    """Read (the one reader, opscan/trust/read.py: size, depth, alias and encoding limits, yaml.SafeLoader) and
    validate a YAML spec file; every problem is a one-line SpecError."""
    from opscan.trust.read import read_yaml

    data = read_yaml(path, "spec", "check the path given to --spec, or fix the file (docs/accept.md)",
                     error=SpecError)
    return parse_spec(data, path)


def _merge_tolerances(base: dict, given: Any, source: str) -> dict[str, dict[str, Tolerance]]:
    if not isinstance(given, dict):
        raise SpecError(f"{source}: tolerances must map a dtype ({', '.join(DTYPES)}) to kinds")
    _only(given, DTYPES, source, "tolerances")
    merged = {d: dict(kinds) for d, kinds in base.items()}
    for dtype, kinds in given.items():
        if not isinstance(kinds, dict):
            raise SpecError(f"{source}: tolerances.{dtype} must map kinds ({', '.join(KINDS)}) to atol/rtol")
        _only(kinds, KINDS, source, f"tolerances.{dtype}")
        for kind, values in kinds.items():
            merged[dtype][kind] = _tolerance(values, merged[dtype][kind], f"{source}: tolerances.{dtype}.{kind}")
    return merged


def _tolerance(values: Any, base: Tolerance, where: str) -> Tolerance:
    if not isinstance(values, dict):
        raise SpecError(f"{where} must be a mapping like {{rtol: 1.0e-3, atol: 1.0e-5}}")
    _only(values, ("atol", "rtol"), where, "this entry")
    numbers = {}
    for key in ("atol", "rtol"):
        value = values.get(key, getattr(base, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SpecError(f"{where}.{key} is {value!r}, not a number ≥ 0 — write e.g. 1.0e-3")
        numbers[key] = float(value)
    return Tolerance(**numbers)


def _integer(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{where} is {value!r}, not an integer ≥ {minimum} — fix the spec")
    return value


def _only(mapping: dict, allowed: tuple[str, ...], source: str, where: str) -> None:
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        raise SpecError(f"{source}: unknown key {unknown[0]!r} in {where} — use one of {', '.join(allowed)}")
