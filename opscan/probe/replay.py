"""Probe stage (worker side): turn a `ProbeCall` back into a real call — the op, its tensors, its arguments.

The tensors and arguments are rebuilt by rebuild.py (the one rebuilder, also copied into every repro script):
seeded floats, recorded integer values, each run's copy on its device or widened on the CPU for the reference.
This module adds what only the probe has: integer and bool tensors without recorded values get them from an
op_probes builder; otherwise inputs that only feed arithmetic or data movement get small random integers, and
an input that indexes something (INDEX_ARGUMENTS) cannot be built (`BuildError`, reported as an `unknown` row
with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opscan.opkey import OpKey
from opscan.probe.protocol import ProbeCall
from opscan.probe.rebuild import BuildError, Fed, dtype_of, initial, laid_out, materialize_args


# integer arguments whose values must point inside another tensor: without recorded values or a builder,
# random ones would measure an out-of-range error instead of the op
INDEX_ARGUMENTS = frozenset({"index", "indices", "target", "targets", "offsets", "offsets2bag", "input_lengths",
                             "target_lengths", "lengths", "indices_or_sections", "sorted_sequence", "boundaries"})


def resolve(op: str):
    """The OpOverload for a display name ("aten::add.Tensor"); BuildError when it is not registered here."""
    key = OpKey.parse(op)
    try:
        return getattr(getattr(getattr(torch.ops, key.namespace), key.name), key.overload)
    except (AttributeError, RuntimeError) as exc:
        raise BuildError(f"{op} is not registered in the probe process ({type(exc).__name__}): a custom op "
                         "defined by the target's own code cannot be replayed in isolation") from None


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
        value = named_args(self.func, self.call.spec).get(name, default)
        return value

    def index(self, name: str) -> int | None:
        """The tensor index of a schema argument, or None when it is not a (single) tensor."""
        value = named_args(self.func, self.call.spec).get(name)
        return value["t"] if isinstance(value, dict) and "t" in value else None

    def fill(self, i: int, values: torch.Tensor) -> None:
        """Give tensor i these values (its recorded shape and stride are kept)."""
        spec = self.call.tensors[i]
        self.tensors[i] = laid_out(values.to(dtype_of(spec.dtype)), spec.shape, spec.stride)
        self.missing.discard(i)


def build(call: ProbeCall, func, given=frozenset()) -> list[torch.Tensor]:
    """The probe's CPU tensors: seeded floats, recorded or built integers (BuildError when impossible).
    Tensors in `given` need no values here: each run takes them from elsewhere (the call's feed)."""
    from op_probes import builder_for

    generator = torch.Generator().manual_seed(call.seed)
    tensors, missing = [], set()
    given = frozenset(given) | fed_indices(call)
    for i, spec in enumerate(call.tensors):
        tensor, needs_values = initial(spec.dtype, spec.shape, spec.stride, spec.values, generator, spec.offset)
        tensors.append(tensor)
        if needs_values and i not in given:
            missing.add(i)
    builder = builder_for(call.op)
    ctx = BuildContext(call, func, tensors, missing, generator)
    if builder is not None:
        builder(ctx)
    if ctx.missing:
        _small_or_fail(ctx)
    return ctx.tensors


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
    for name, value in named_args(func, spec).items():
        found = value if isinstance(value, list) else [value]
        if any(isinstance(v, dict) and v.get("t") == i for v in found):
            return name
    return None


def materialize(call: ProbeCall, tensors, device: str, wide: bool, feed: Fed | None = None, run_op=None):
    """(args, kwargs) for one run: tensors copied to `device` (float64/complex128 when `wide`; host tensors stay on
    the CPU), the inputs the call's feed makes made by its forward on `device` (run by `run_op`)."""
    hosts = {i for i, t in enumerate(call.tensors) if t.host}
    return materialize_args(tensors, [t.dtype for t in call.tensors], call.spec, call.seed, device, wide, feed,
                            run_op, hosts)


def fed_indices(call: ProbeCall) -> frozenset:
    """The call's tensors its feed makes (none without one)."""
    return frozenset(c for c, _ in call.feed.outputs) if call.feed else frozenset()


def feed_of(call: ProbeCall) -> tuple[Fed | None, str | None]:
    """(the call's forward, ready to run, or None; why it is None although the call has a feed). A forward that
    cannot be built here leaves the call with its recorded inputs, never without a measurement."""
    feed = call.feed
    if feed is None:
        return None, None
    try:
        func = resolve(feed.op)
        as_call = ProbeCall(call.id, feed.op, feed.tensors, feed.spec, feed.seed)
        tensors = build(as_call, func, frozenset(f for f, _ in feed.shared))
    except BuildError as exc:
        return None, f"recorded (the forward {feed.op} cannot be built: {str(exc)[:200]})"
    return Fed(func, tensors, [t.dtype for t in feed.tensors], feed.spec, feed.seed, feed.shared, feed.outputs), None


def named_args(func, spec: dict) -> dict:
    """A call's arguments by their schema names (tensors as {"t": i})."""
    names = [a.name for a in func._schema.arguments]
    named = dict(zip(names, spec.get("args", [])))
    named.update(spec.get("kwargs", {}))
    return named
