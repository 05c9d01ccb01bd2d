"""Probe stage (worker side) and every repro script: THE rebuilding of a recorded call's tensors and arguments.

One source: the probe worker rebuilds its calls through it (replay.py adds op_probes' builders and the probe's
own checks), and opscan/repro/script.py copies this file, byte for byte, into every generated repro script,
after comparison.py (a test holds the copy to this file). So it is written for both: torch and the standard
library only, nothing from opscan, no `from __future__`, and no `__main__` guard.

Tensors are built on the CPU from the call's seed (one generator per call, drawn in tensor order) with the
recorded shapes, strides and storage offsets (overlapping and expanded layouts included: each tensor is a view of
a 1-D storage, starting at its offset); recorded values (a nested list, or {"zlib": bytes} in a script) replace
the seeded ones. Each run copies each storage whole onto its device, so a view keeps its offset there (a known
MPS bug may read a sliced input from element 0), floating ones widened to REFERENCE_DTYPE for the float64 CPU
reference; a tensor recorded on the host (a CPU 0-dim operand of an MPS call) stays on the CPU. Anything this torch
cannot rebuild (a dtype, layout or argument type it lacks) raises BuildError: the probe's row is `unknown`, a
script exits 2 — never the op's own failure.

A call that consumes what a forward made (saved statistics, indices, workspaces) carries that forward (`Fed`):
each run makes those inputs by running the forward first on the run's own device (the reference: on the CPU,
widened like the call), so the call never gets tensors its device's forward would not make.
"""

import zlib

import torch

# the floating and complex dtypes, seeded, and the dtype their values are drawn in (randn has no half-precision
# CPU path in older releases)
RANDOM_DTYPE = {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64",
                "complex64": "complex64", "complex128": "complex128"}
# the dtype a floating input takes in the widened CPU reference
REFERENCE_DTYPE = {"float16": "float64", "bfloat16": "float64", "float32": "float64", "float64": "float64",
                   "complex64": "complex128", "complex128": "complex128"}


class BuildError(Exception):
    """This torch cannot rebuild the call's inputs or arguments (a probe: an `unknown` row; a script: exit 2)."""


def dtype_of(name):
    """torch's dtype called `name`; BuildError when this torch has none."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BuildError("torch " + torch.__version__ + " has no dtype " + str(name))
    return dtype


def storage_size(shape, stride):
    """Elements of the 1-D storage a (shape, stride) view needs."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def initial(dtype_name, shape, stride, values, generator, offset=0):
    """(tensor, needs values): seeded floats (the generator advances for every floating tensor), recorded
    `values` where there are some, else zeros that still need values (integer and bool tensors); a view `offset`
    elements into its storage."""
    dtype = dtype_of(dtype_name)
    n = storage_size(shape, stride) + offset
    floating = dtype_name in RANDOM_DTYPE
    if floating:
        base = torch.randn(n, generator=generator, dtype=dtype_of(RANDOM_DTYPE[dtype_name])).to(dtype)
    else:
        base = torch.zeros(n, dtype=dtype)
    if values is not None:
        found = laid_out(values_of(values, dtype), shape, stride)
        if not offset:
            return found, False
        placed = base.as_strided(tuple(found.shape), tuple(found.stride()), offset)
        return placed.copy_(found), False
    return base.as_strided(shape, stride, offset), not floating


def values_of(values, dtype):
    """A tensor from recorded values: a nested list, or {"zlib": bytes} (little-endian, row-major)."""
    if isinstance(values, dict):
        return torch.frombuffer(bytearray(zlib.decompress(values["zlib"])), dtype=dtype).clone()
    return torch.tensor(values, dtype=dtype)


def laid_out(values, shape, stride):
    """`values` in the recorded shape, with the recorded strides where they do not overlap (an expanded
    tensor gets the same values, dense)."""
    values = values.reshape(shape)
    dims = sorted((abs(st), s) for s, st in zip(shape, stride) if s > 1)
    expected = 1
    for st, s in dims:
        if st < expected:
            return values.contiguous()
        expected = st * s
    return torch.empty_strided(shape, stride, dtype=values.dtype).copy_(values)


def materialize_args(tensors, dtype_names, spec, seed, device, wide, feed=None, run_op=None, hosts=()):
    """(args, kwargs) for one run: each tensor's storage copied whole to `device` (the CPU for the tensors whose
    index is in `hosts`), keeping its view's offset (floating ones widened to REFERENCE_DTYPE when `wide`; never
    the built tensor itself: ops write in place), the arguments decoded. With `feed` (a Fed), the inputs its
    forward makes are that forward's outputs in this run, the forward run by `run_op` (see Fed)."""
    placed = place_tensors(tensors, dtype_names, device, wide, hosts)
    if feed is not None:
        feed.run(placed, device, wide, run_op)
    return decode_args(spec, placed, device, seed)


def place_tensors(tensors, dtype_names, device, wide, hosts=()):
    """Each tensor's storage copied whole to `device` (the CPU for those whose index is in `hosts`), keeping its
    view's offset (floating ones widened to REFERENCE_DTYPE when `wide`)."""
    placed = []
    for i, (t, name) in enumerate(zip(tensors, dtype_names)):
        dtype = dtype_of(REFERENCE_DTYPE[name]) if wide and name in REFERENCE_DTYPE else t.dtype
        offset = t.storage_offset()
        n = storage_size(tuple(t.shape), tuple(t.stride())) + offset
        where = "cpu" if i in hosts else device
        storage = t.as_strided((n,), (1,), 0).to(device=where, dtype=dtype, copy=True)
        placed.append(storage.as_strided(tuple(t.shape), tuple(t.stride()), offset))
    return placed


def decode_args(spec, placed, device, seed):
    """(args, kwargs) of a recorded spec over the placed tensors."""
    args = [decode_argument(a, placed, device, seed) for a in spec.get("args", [])]
    kwargs = {k: decode_argument(v, placed, device, seed) for k, v in spec.get("kwargs", {}).items()}
    return args, kwargs


class Fed:
    """The forward call that makes some of a call's inputs (saved statistics, indices, workspaces), run first in
    each run of the call, on that run's device, so the call consumes what that device's own forward makes.

    `func`: the forward op; `tensors`/`dtype_names`/`spec`/`seed`: its own inputs and arguments, built like a
    call's; `shared`: (forward tensor, call tensor) pairs that are one tensor in the step (the call's placed
    tensor is passed, so an in-place update of the forward reaches the call as in the step); `outputs`: (call
    tensor, position among the forward's tensor outputs). `run(..., run_op)` runs it with `run_op(func, args,
    kwargs)` (default: a plain call). When the forward raises on the device, its outputs are made on the CPU and
    copied to the device (what PyTorch's CPU fallback would hand on); when it fails on the CPU as well, the call
    keeps its recorded inputs. `made` says which happened, for the record: "<device>", "cpu (...)" or
    "recorded (...)"."""

    def __init__(self, func, tensors, dtype_names, spec, seed, shared, outputs):
        self.func, self.tensors, self.dtype_names, self.spec, self.seed = func, tensors, dtype_names, spec, seed
        self.shared, self.outputs = [tuple(p) for p in shared], [tuple(p) for p in outputs]
        self.made = None
        self.label = None  # the device's name in `made` (default: the device string)

    def run(self, placed, device, wide, run_op=None):
        """Replace the fed tensors of `placed` (the call's tensors on `device`) by the forward's outputs."""
        where = self.label or device
        try:
            self._into(placed, device, wide, run_op or plain_call)
            self.made = where
            return
        except BuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - the forward's own failure: fall back, and say so
            why = type(exc).__name__ + ": " + (str(exc).strip().splitlines() or [""])[0][:200]
        on_cpu = [t.detach().to("cpu") for t in placed]
        try:
            self._into(on_cpu, "cpu", wide, plain_call)
        except BuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - not even the CPU makes them: keep the recorded inputs
            self.made = "recorded (the forward raised on " + where + ": " + why + "; and on the CPU: " + \
                type(exc).__name__ + ")"
            return
        for call_index, _ in self.outputs:
            placed[call_index] = on_cpu[call_index].to(device)
        self.made = "cpu (the forward raised on " + where + ": " + why + ")"

    def _into(self, placed, device, wide, run_op):
        mine = place_tensors(self.tensors, self.dtype_names, device, wide)
        for feed_index, call_index in self.shared:
            mine[feed_index] = placed[call_index]
        args, kwargs = decode_args(self.spec, mine, device, self.seed)
        made = [v for v in flatten(run_op(self.func, args, kwargs)) if isinstance(v, torch.Tensor)]
        for call_index, position in self.outputs:
            if position >= len(made):
                raise RuntimeError("the forward made " + str(len(made)) + " tensors, not " + str(position + 1))
            placed[call_index] = made[position].detach()


def decode_argument(value, tensors, device, seed):
    """One recorded argument (trace/argspec.py's encoding) back as a Python or torch value; the step's device
    becomes `device`, a generator is seeded with `seed`."""
    if isinstance(value, list):
        return [decode_argument(v, tensors, device, seed) for v in value]
    if not isinstance(value, dict):
        return value
    if "t" in value:
        return tensors[value["t"]]
    (tag, payload), = value.items()
    if tag == "float":
        return float(payload)
    if tag == "complex":
        return complex(*payload)
    if tag in ("dtype", "layout", "memory_format"):
        found = getattr(torch, str(payload), None)
        if found is None:
            raise BuildError("torch " + torch.__version__ + " has no " + tag + " " + str(payload))
        return found
    if tag == "device":
        return torch.device(device)
    if tag == "generator":
        return torch.Generator(device=device).manual_seed(seed)
    raise BuildError("an argument of type " + str(payload if tag == "unsupported" else tag) + " cannot be replayed")


def plain_call(func, args, kwargs):
    """Run an op."""
    return func(*args, **kwargs)


def collect(func, out, args, kwargs):
    """The values a run produced, in order: its outputs, or for an op that returns nothing the arguments it
    writes (`_foreach_add_`, `_fused_adamw_`)."""
    if func._schema.returns:
        return flatten(out)
    named = dict(zip([a.name for a in func._schema.arguments], args))
    named.update(kwargs)
    return [leaf for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
            and a.name in named for leaf in flatten(named[a.name])]


def flatten(value):
    """Leaves of nested tuples and lists."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]
