"""Probe stage (worker side): turn a `ProbeCall` back into a real call — the op, its tensors, its arguments.

Tensors are built once on the CPU from the probe's seed, with the recorded shapes and strides
(overlapping and expanded layouts included: each tensor is a view of a 1-D storage), then copied per
run: onto the probe device in the probe's dtypes, or onto the CPU in float64 for the reference.
Integer and bool tensors take their recorded values; when there are none, an op_probes builder makes
valid ones; otherwise inputs that only feed arithmetic or data movement get small random integers, and
an input that indexes something (INDEX_ARGUMENTS) cannot be built (`BuildError`, reported as an
`unknown` row with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opscan.opkey import OpKey
from opscan.probe.protocol import ProbeCall, TensorSpec

FLOATING = {"float64", "float32", "float16", "bfloat16"}
COMPLEX = {"complex64", "complex128"}
RANDOM_DTYPE = {"float16": torch.float32, "bfloat16": torch.float32, "float32": torch.float32,
                "float64": torch.float64, "complex64": torch.complex64, "complex128": torch.complex128}
WIDE = {"float16": torch.float64, "bfloat16": torch.float64, "float32": torch.float64, "float64": torch.float64,
        "complex64": torch.complex128, "complex128": torch.complex128}


# integer arguments whose values must point inside another tensor: without recorded values or a builder,
# random ones would measure an out-of-range error instead of the op
INDEX_ARGUMENTS = frozenset({"index", "indices", "target", "targets", "offsets", "offsets2bag", "input_lengths",
                             "target_lengths", "lengths", "indices_or_sections", "sorted_sequence", "boundaries"})


class BuildError(Exception):
    """The probe's inputs cannot be built: the call cannot be replayed (an `unknown` row)."""


def resolve(op: str):
    """The OpOverload for a display name ("aten::add.Tensor"); BuildError when it is not registered here."""
    key = OpKey.parse(op)
    try:
        return getattr(getattr(getattr(torch.ops, key.namespace), key.name), key.overload)
    except (AttributeError, RuntimeError) as exc:
        raise BuildError(f"{op} is not registered in the probe process ({type(exc).__name__}): a custom op "
                         "defined by the target's own code cannot be replayed in isolation") from None


def storage_size(shape, stride) -> int:
    """Elements of the 1-D storage a (shape, stride) view needs."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


@dataclass
class BuildContext:
    """What a probe-input builder (op_probes/) sees and may change: the CPU tensors, the decoded
    non-tensor arguments by schema name, and which integer tensors still need values."""

    call: ProbeCall
    func: object
    tensors: list
    missing: set
    generator: torch.Generator

    def arg(self, name: str, default=None):
        """A non-tensor argument by its schema name (tensors come back as their index)."""
        value = _named_args(self.func, self.call.spec).get(name, default)
        return value

    def index(self, name: str) -> int | None:
        """The tensor index of a schema argument, or None when it is not a (single) tensor."""
        value = _named_args(self.func, self.call.spec).get(name)
        return value["t"] if isinstance(value, dict) and "t" in value else None

    def fill(self, i: int, values: torch.Tensor) -> None:
        """Give tensor i these values (its recorded shape and stride are kept)."""
        spec = self.call.tensors[i]
        self.tensors[i] = _as_recorded(values.to(getattr(torch, spec.dtype)), spec)
        self.missing.discard(i)


def build(call: ProbeCall, func) -> list[torch.Tensor]:
    """The probe's CPU tensors: seeded floats, recorded or built integers (BuildError when impossible)."""
    from op_probes import builder_for

    generator = torch.Generator().manual_seed(call.seed)
    tensors, missing = [], set()
    for i, spec in enumerate(call.tensors):
        tensor, needs_values = _initial(spec, generator)
        tensors.append(tensor)
        if needs_values:
            missing.add(i)
    builder = builder_for(call.op)
    ctx = BuildContext(call, func, tensors, missing, generator)
    if builder is not None:
        builder(ctx)
    if ctx.missing:
        _small_or_fail(ctx)
    return ctx.tensors


def _initial(spec: TensorSpec, generator) -> tuple[torch.Tensor, bool]:
    dtype = getattr(torch, spec.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise BuildError(f"unknown dtype {spec.dtype!r}")
    n = storage_size(spec.shape, spec.stride)
    if spec.dtype in FLOATING or spec.dtype in COMPLEX:
        base = torch.randn(n, generator=generator, dtype=RANDOM_DTYPE[spec.dtype]).to(dtype)
        return base.as_strided(spec.shape, spec.stride), False
    if spec.values is not None:
        return _as_recorded(torch.tensor(spec.values, dtype=dtype), spec), False
    base = torch.zeros(n, dtype=dtype)
    return base.as_strided(spec.shape, spec.stride), True


def _as_recorded(values: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """values (contiguous, the recorded shape) laid out with the recorded strides where they allow it."""
    values = values.reshape(spec.shape)
    if _overlapping(spec.shape, spec.stride):
        return values.contiguous()  # an expanded integer tensor: same values, dense layout
    out = torch.empty_strided(spec.shape, spec.stride, dtype=values.dtype)
    return out.copy_(values)


def _overlapping(shape, stride) -> bool:
    dims = sorted((abs(st), s) for s, st in zip(shape, stride) if s > 1)
    expected = 1
    for st, s in dims:
        if st < expected:
            return True
        expected = st * s
    return False


def _small_or_fail(ctx: BuildContext) -> None:
    """Small random integers (bits for bool) for integer inputs whose values only feed arithmetic or data
    movement; an input that indexes something (by its schema name) without a builder cannot be built."""
    pointwise = torch.Tag.pointwise in getattr(ctx.func, "tags", ())
    for i in sorted(ctx.missing):
        spec = ctx.call.tensors[i]
        role = _argument_of(ctx.func, ctx.call.spec, i)
        if role in INDEX_ARGUMENTS and not pointwise:
            raise BuildError(
                f"no values were recorded for {role} (input {i}, {spec.dtype}{list(spec.shape)}) of {ctx.call.op} "
                "(fake tensors or more than the value cap) and op_probes has no builder that makes valid ones")
        high = 2 if spec.dtype == "bool" else 4
        ctx.fill(i, torch.randint(0, high, spec.shape, generator=ctx.generator))


def _argument_of(func, spec: dict, i: int) -> str | None:
    """The schema name of the argument that holds tensor i (directly or in a list)."""
    for name, value in _named_args(func, spec).items():
        found = value if isinstance(value, list) else [value]
        if any(isinstance(v, dict) and v.get("t") == i for v in found):
            return name
    return None


def materialize(call: ProbeCall, tensors, device: str, wide: bool):
    """(args, kwargs) for one run: tensors copied to `device` (float64/complex128 when `wide`)."""
    placed = [_place(t, spec, device, wide) for t, spec in zip(tensors, call.tensors)]
    seed = call.seed
    args = [decode(a, placed, device, seed) for a in call.spec.get("args", [])]
    kwargs = {k: decode(v, placed, device, seed) for k, v in call.spec.get("kwargs", {}).items()}
    return args, kwargs


def _place(t: torch.Tensor, spec: TensorSpec, device: str, wide: bool) -> torch.Tensor:
    dtype = WIDE.get(spec.dtype, t.dtype) if wide else t.dtype
    n = storage_size(tuple(t.shape), tuple(t.stride()))
    storage = t.as_strided((n,), (1,), t.storage_offset())
    copy = storage.to(device=device, dtype=dtype, copy=True)  # never the built tensor itself: ops write in place
    return copy.as_strided(tuple(t.shape), tuple(t.stride()))


def decode(value, tensors, device: str, seed: int):
    """One encoded argument back as a Python/torch value (trace/argspec.py's table, read backwards)."""
    if isinstance(value, list):
        return [decode(v, tensors, device, seed) for v in value]
    if not isinstance(value, dict):
        return value
    if "t" in value:
        return tensors[value["t"]]
    (tag, payload), = value.items()
    return _DECODERS[tag](payload, device, seed)


def _unsupported(payload, device, seed):
    raise BuildError(f"an argument of type {payload} cannot be replayed")


_DECODERS = {
    "float": lambda p, d, s: float(p),
    "complex": lambda p, d, s: complex(*p),
    "dtype": lambda p, d, s: getattr(torch, p),
    "device": lambda p, d, s: torch.device(d),  # the step's device becomes the probe's device
    "layout": lambda p, d, s: getattr(torch, p),
    "memory_format": lambda p, d, s: getattr(torch, p),
    "generator": lambda p, d, s: torch.Generator(device=d).manual_seed(s),
    "unsupported": _unsupported,
}


def _named_args(func, spec: dict) -> dict:
    names = [a.name for a in func._schema.arguments]
    named = dict(zip(names, spec.get("args", [])))
    named.update(spec.get("kwargs", {}))
    return named


def collect(func, out, args, kwargs) -> list:
    """The values a run produced, in order: its outputs, or for an op that returns nothing the
    arguments it writes (`_foreach_add_`, `_fused_adamw_`)."""
    leaves = _flatten(out)
    if func._schema.returns:
        return leaves
    written = []
    named = dict(zip([a.name for a in func._schema.arguments], args))
    named.update(kwargs)
    for argument in func._schema.arguments:
        if argument.alias_info is not None and argument.alias_info.is_write and argument.name in named:
            written.extend(_flatten(named[argument.name]))
    return written


def _flatten(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _flatten(v)]
    return [value]
