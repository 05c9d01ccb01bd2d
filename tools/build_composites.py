#!/usr/bin/env python3
"""Record what each composite overload calls, for `opscan coverage` (opscan/knowledge/composites.txt).

    python tools/build_composites.py            # writes opscan/knowledge/composites.txt
    python tools/build_composites.py --check    # compare with the shipped file

Needs the installed torch with its test helpers (`pip install expecttest`: a build-time dependency only).
For every OpInfo of `torch.testing._internal.common_methods_invocations.op_db`, up to SAMPLES sample inputs
run on the CPU in the OpInfo's first CPU dtype (float32 when it has it), through the OpInfo's function, its
out= variant (output buffers taken from a first run) and its in-place variant, under inference_mode and a
TorchDispatchMode that re-dispatches every composite to its composite kernel (CompositeImplicitAutograd, else
CompositeExplicitAutograd(NonFunctional)), so the whole call tree is seen. The MPS device branches replace
what the CPU branch runs (`convolution` -> `_mps_convolution(_transpose)`, mps_view.py's rule
`mps-convolution`). Every composite overload met anywhere in a tree gets a line per distinct set of direct
callees, naming the first sample that called it so:

    OVERLOAD SAMPLE CALLEE ...      (yaml spellings; SAMPLE = OpInfo#index[:variant]; no CALLEE: metadata only)

at most KEEP lines an overload. coverage.py judges a composite by the worst of its callees, release by
release; an overload no sample reaches stays `unknown` with that reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from table_output import write_or_check  # noqa: E402
from opscan.knowledge.composites import COMPOSITES_PATH, format_composites  # noqa: E402
from opscan.opkey import OpKey  # noqa: E402

SAMPLES = 8
KEEP = 3


def recorder_class(torch, composite_names):
    """A TorchDispatchMode class recording the composite call tree (see the module docstring)."""
    from torch._C import DispatchKey
    from torch.utils._python_dispatch import TorchDispatchMode

    cia = DispatchKey.CompositeImplicitAutograd
    explicit = (DispatchKey.CompositeExplicitAutograd, DispatchKey.CompositeExplicitAutogradNonFunctional)

    def composite_key(func):
        name = func.name()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, cia):
            return cia
        if OpKey.of(func).yaml_name not in composite_names:
            return None
        return next((k for k in explicit if torch._C._dispatch_has_kernel_for_dispatch_key(name, k)), None)

    class Recorder(TorchDispatchMode):
        """edges: composite overload -> list of its direct-callee lists (one per call)."""

        def __init__(self):
            super().__init__()
            self.stack: list[list[str]] = []
            self.edges: dict[str, list[tuple[str, ...]]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            args, kwargs = tensorized(torch, func, args, kwargs or {})
            key = OpKey.of(func)
            name = key.yaml_name if key.namespace == "aten" else key.display
            if self.stack:
                self.stack[-1].append(_branch(name, args))
            if key.namespace != "aten" or name in ("convolution", "convolution_backward"):
                return func(*args, **kwargs)
            dk = composite_key(func)
            if dk is None:
                return func(*args, **kwargs)
            self.stack.append([])
            try:
                with self:
                    out = func._op_dk(dk, *args, **kwargs)
            except Exception:  # noqa: BLE001 - the composite kernel refused: run it plainly, callees unknown
                self.stack.pop()
                return func(*args, **kwargs)
            self.edges.setdefault(name, []).append(tuple(dict.fromkeys(self.stack.pop())))
            return out

    return Recorder


def tensorized(torch, func, args, kwargs):
    """(args, kwargs) with Python numbers made tensors where the schema wants a Tensor: a composite kernel's
    wrapped scalar (`fmod.Scalar` calls fmod.Tensor with one) reaches Python as a plain number."""
    schema = func._schema.arguments
    args = [torch.tensor(a) if isinstance(a, (int, float, bool)) and i < len(schema) and
            str(schema[i].type) == "Tensor" else a for i, a in enumerate(args)]
    return args, kwargs


def _branch(name: str, args) -> str:
    """The op MPS runs where the CPU runs `name` (mps_view.py's mps-convolution rule)."""
    if name == "convolution" and len(args) > 6:
        return "_mps_convolution_transpose" if args[6] else "_mps_convolution"
    if name == "convolution_backward" and len(args) > 7:
        return "mps_convolution_transpose_backward" if args[7] else "mps_convolution_backward"
    return name


def variants(op, sample):
    """(suffix, callable) of the ways to call one sample: function, out=, in-place."""
    fn = lambda: op(sample.input, *sample.args, **sample.kwargs)  # noqa: E731
    out = [("", fn)]
    if op.supports_out:
        out.append((":out", lambda: _with_out(op, sample)))
    if op.inplace_variant is not None:
        out.append((":inplace", lambda: op.inplace_variant(sample.input.clone(), *sample.args, **sample.kwargs)))
    return out


def _with_out(op, sample):
    """Call `op` with out= buffers shaped like a plain call's result."""
    import torch

    with torch.utils._python_dispatch._disable_current_modes():
        result = op(sample.input, *sample.args, **sample.kwargs)
    if isinstance(result, torch.Tensor):
        return op(sample.input, *sample.args, **sample.kwargs, out=torch.empty_like(result))
    buffers = tuple(torch.empty_like(r) for r in result)
    return op(sample.input, *sample.args, **sample.kwargs, out=buffers)


def record(op, torch, recorder_cls, edges: dict) -> None:
    """Run up to SAMPLES samples of one OpInfo and merge their composite edges into `edges`."""
    supported = op.supported_dtypes("cpu")
    dtype = torch.float32 if torch.float32 in supported else min(supported, key=str, default=None)
    if dtype is None:
        return
    torch.manual_seed(0)
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES]
    except Exception:  # noqa: BLE001 - a broken sample generator records nothing
        return
    for index, sample in enumerate(samples):
        for suffix, call in variants(op, sample):
            rec = recorder_cls()
            try:
                with torch.inference_mode(), rec:
                    call()
            except Exception:  # noqa: BLE001 - a failing variant tells nothing
                continue
            tag = f"{op.name + op.variant_test_name}#{index}{suffix}"
            for name, calls in rec.edges.items():
                for callees in calls:
                    kept = edges.setdefault(name, {})
                    if callees not in kept and len(kept) < KEEP:
                        kept[callees] = tag


_SHAPES = ((3, 4), (4,), (2, 3, 4, 5), (2, 3, 4), (1, 2, 3, 4, 5))
_SIZE_NAMES = ("size", "shape", "sizes", "normalized_shape", "stride", "kernel_size")


def synthetic_args(schema, torch, shape, dtype):
    """(args, kwargs) for an overload's schema from one recipe: tensors of `shape` and `dtype`, small ints,
    defaults where the schema has them; None when an argument cannot be made (a Dimname, a string)."""
    args, kwargs = [], {}
    for arg in schema.arguments:
        value = _value(arg, torch, shape, dtype)
        if value is _SKIP:
            if arg.kwarg_only:
                continue
            return None
        (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))
    return args, kwargs


_SKIP = object()


def _value(arg, torch, shape, dtype):  # noqa: C901 - one branch per schema type
    kind = str(arg.type)
    if arg.name == "out" or (arg.alias_info is not None and arg.alias_info.is_write and arg.kwarg_only):
        return [torch.empty(0, dtype=dtype)] * 2 if kind.startswith("List") else torch.empty(0, dtype=dtype)
    if arg.has_default_value() and (arg.kwarg_only or not kind.endswith("Tensor")):
        return _SKIP if arg.kwarg_only else arg.default_value
    if kind in ("Tensor", "Optional[Tensor]"):
        return _tensor(torch, shape, dtype) if kind == "Tensor" else None
    if kind in ("List[Tensor]", "List[Optional[Tensor]]"):
        return [_tensor(torch, shape, dtype), _tensor(torch, shape, dtype)]
    named = {"dtype": dtype, "layout": torch.strided, "memory_format": torch.contiguous_format,
             "device": torch.device("cpu")}
    if arg.name in named and kind in ("int", "Optional[int]", "Device", "Optional[Device]"):
        return named[arg.name]
    if kind in ("int", "SymInt"):
        return 2 if arg.name in ("n", "k", "size", "steps", "window_length", "high", "num_classes") else 0
    if kind in ("List[int]", "List[SymInt]", "Optional[List[int]]", "Optional[List[SymInt]]"):
        if arg.name == "output_size":  # pooling and upsampling: the spatial sizes
            return list(shape[2:])
        return list(shape) if arg.name in _SIZE_NAMES else [0]
    plain = {"float": 0.5, "bool": False, "Scalar": 1, "number": 1, "ScalarType": dtype, "Optional[number]": 2,
             "List[number]": [1, 1], "Optional[List[float]]": None,
             "Optional[ScalarType]": None, "Layout": torch.strided, "Device": torch.device("cpu"),
             "MemoryFormat": torch.contiguous_format, "Optional[Generator]": None, "Optional[float]": None,
             "Optional[int]": None, "Optional[bool]": None, "Optional[Scalar]": None, "Optional[str]": None,
             "List[float]": [0.5], "List[Scalar]": [1, 1], "List[bool]": [True, True, True]}
    return plain.get(kind, _SKIP)


def _tensor(torch, shape, dtype):
    if dtype.is_floating_point:
        return torch.rand(shape, dtype=dtype) + 0.5
    return torch.ones(shape, dtype=dtype)


def record_synthetic(torch, recorder_cls, names, edges: dict) -> None:
    """Call every composite overload no OpInfo sample reached with synthetic arguments (module docstring),
    each in a forked child: a bad argument can crash a kernel (a segfault is a lost overload, not a lost build)."""
    todo = sorted(names - set(edges))
    for number, name in enumerate(todo):
        if number % 100 == 0:
            print(f"build_composites: synthetic calls {number}/{len(todo)}", file=sys.stderr)
        found = isolated(lambda: _synthetic(torch, recorder_cls, name))  # noqa: B023 - called at once
        for index, recorded in found or ():
            for callee_of, calls in recorded.items():
                for callees in calls:
                    kept = edges.setdefault(callee_of, {})
                    if tuple(callees) not in kept and len(kept) < KEEP:
                        kept[tuple(callees)] = f"synthetic:{name}#{index}"


def _synthetic(torch, recorder_cls, name: str) -> list:
    """[(recipe index, {overload: [callees, ...]})] of the first recipe that runs `name`."""
    op_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op_name, None)
    func = getattr(packet, overload or "default", None) if packet is not None else None
    if func is None:
        return []
    for index, (shape, dtype) in enumerate((s, d) for d in (torch.float32, torch.int64) for s in _SHAPES):
        made = synthetic_args(func._schema, torch, shape, dtype)
        if made is None:
            return []
        rec = recorder_cls()
        try:
            torch.manual_seed(0)
            with torch.inference_mode(), rec:
                func(*made[0], **made[1])
        except Exception:  # noqa: BLE001 - this recipe does not fit the op: try the next
            continue
        if name in rec.edges:
            return [(index, {k: [list(c) for c in v] for k, v in rec.edges.items()})]
    return []


def isolated(fn, timeout: int = 10):
    """fn() run in a forked child, its JSON result returned; None when the child crashed or timed out."""
    import json
    import signal

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        signal.alarm(timeout)
        try:
            data = json.dumps(fn()).encode()
        except BaseException:  # noqa: BLE001 - whatever fails, the parent learns nothing
            data = b"null"
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else None


def build() -> str:
    """The text of composites.txt for the installed torch."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from opscan.knowledge.build import read_installed
    from opscan.knowledge.optable import OpTable

    torch.set_num_threads(1)  # one thread: OpenMP's pool does not survive the forks of record_synthetic
    table = OpTable.from_records(read_installed().records(), "installed", "-")
    composite_names = frozenset(o.yaml_name for o, entry in table.overloads.items() if entry.composite)
    recorder_cls = recorder_class(torch, composite_names)
    edges: dict[str, dict[tuple[str, ...], str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            record(op, torch, recorder_cls, edges)
        print(f"build_composites: {len(edges)} composites reached by OpInfo samples", file=sys.stderr)
        record_synthetic(torch, recorder_cls, composite_names, edges)
    release = torch.__version__.split("+", 1)[0]
    return format_composites(release, torch.version.git_version, edges)


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) composites.txt."""
    p = argparse.ArgumentParser(prog="build_composites.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    p.add_argument("--output", default=COMPOSITES_PATH)
    args = p.parse_args(argv)
    text = build()
    return write_or_check("build_composites", args.output, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
