"""Repro stage: the minimal snippet that leads each ISSUE.md (PyTorch's bug template asks for "a minimal,
self-contained code snippet"). Pure: built from one call entry of the report's `repro` section, no torch.

At most MAX_LINES lines a maintainer can paste: the public call where one dispatches the op (public_calls.py,
`F.adaptive_avg_pool2d(x, (3, 3))`), else `torch.ops.aten.<name>.<overload>(...)`; each tensor built in one line
(floating ones random, integer ones from the recorded values, or random within their range); the call run on the
issue's device (`python repro.py`; `python repro.py cpu` on the CPU), the error it raises printed, else its result
compared with the CPU's by `torch.testing.assert_close` (whose message prints the mismatch). PyTorch's CPU-fallback
warning is turned into that error. Exit codes as the full script's (runtime.py): 1 the failure reproduced (raised,
fell back, or disagreed), 0 not, 2 it cannot run here (the device is not available: off a Mac, MPS is not, and a
run there must never read as "reproduced"). The snippet simplifies — contiguous tensors (a comment names
the recorded strides), random values where the step's were not recorded, a same-dtype CPU reference — the full
script beside ISSUE.md replays the exact call.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib

from opscan.opkey import TORCH_NAMESPACES
from opscan.probe.comparison import FALLBACK_WARNING
from opscan.repro.public_calls import spelling

MAX_LINES = 15
NAMES = "xyzuvw"
FLOATING = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64"}
_COMPLEX = {"complex32", "complex64", "complex128"}
PACKED = {"int64": "q", "int32": "i", "int16": "h", "int8": "b", "uint8": "B", "bool": "?", "float64": "d",
          "float32": "f", "float16": "e"}
INLINE_VALUES = 12  # integer tensors of at most this many recorded values are written out
# the device must exist here, else exit 2 "cannot run here" (off a Mac there is no MPS: nothing reproduces there)
MISSING_DEVICE = 'device != "cpu" and not (torch.backends.mps if device == "mps" else torch.cuda).is_available()'
NO_DEVICE = "no {device} on this machine (MPS needs a Mac with Apple Silicon)"
# PyTorch's CPU-fallback warning, as probe/comparison.py recognises it (its tail: no quote or group to escape)
FALLBACK_TAIL = ".*" + FALLBACK_WARNING.pattern.rpartition(" and ")[2]


def snippet_text(call: dict, device: str = "mps") -> str | None:
    """The snippet for one call entry of a finding, run on `device` unless told otherwise on its command line
    (None: its arguments cannot be written, or it is too long)."""
    probe = call["probe"]
    tensors = [_tensor(i, spec, (call.get("inline") or {}).get(str(i))) for i, spec in enumerate(probe["tensors"])]
    if None in tensors:
        return None
    names = [_name(i) for i in range(len(tensors))]
    try:
        expr, uses_f = _call_expr(probe, names)
    except ValueError:
        return None
    compared = not call.get("properties")
    for pack in (False, True):  # one line per tensor, else the assignments packed into one
        lines = _lines(tensors, names, expr, uses_f, compared, _missing_check(probe["op"]), pack, device)
        if len(lines) <= MAX_LINES:
            return "\n".join(lines) + "\n"
    return None


def _missing_check(op: str) -> list[str]:
    """Exit 2 ("cannot run here", as the scripts) where the device is missing — and, for an operator outside torch's
    own namespaces, when this process has not registered it (import the code that defines it first)."""
    namespace, _, rest = op.partition("::")
    if namespace in TORCH_NAMESPACES:
        return [f"if {MISSING_DEVICE}:", f'    sys.exit(print(f"cannot run here: {NO_DEVICE}") or 2)']
    name = rest.partition(".")[0]
    return [f'if not hasattr(torch.ops.{namespace}, "{name}") or {MISSING_DEVICE}:  # import the scanned code first',
            f'    sys.exit(print(f"cannot run here: this process has no operator {namespace}::{name}, or {NO_DEVICE}")'
            " or 2)"]


def _lines(tensors: list[tuple[str, str]], names: list[str], expr: str, uses_f: bool, compared: bool,
           check: list[str], pack: bool, device: str) -> list[str]:
    imports = "import sys, warnings, torch" + (", torch.nn.functional as F" if uses_f else "")
    head = [imports, f"device = sys.argv[1] if len(sys.argv) > 1 else {json.dumps(str(device))}",  # data, not code
            *check,
            f'warnings.filterwarnings("error", "{FALLBACK_TAIL}")  # PyTorch\'s CPU-fallback warning raises',
            "torch.manual_seed(0)"]
    built = [f"{n} = {t}" + (f"  # the step's had strides {note}" if note else "") for n, (t, note) in
             zip(names, tensors)]
    if pack and len(built) > 1:
        built = [_packed(names, tensors)]
    params = ", ".join(names)
    if names:
        args = f"{names[0]}," if len(names) == 1 else params
        built.append(f"inputs = lambda d: [t.to(d, copy=True) for t in ({args})]")
    run = [f"run = lambda {params}: {expr}"]
    call = "run(*inputs(device))" if names else "run()"
    body = ["try:", f"    out = {call}", "except Exception as e:  # the failure: printed, exit 1",
            '    sys.exit(print(f"{type(e).__name__}: {e}") or 1)']
    reference = "run(*inputs(\"cpu\"))" if names else "run()"
    tail = ([f"torch.testing.assert_close(out, {reference}, check_device=False, equal_nan=True)  # a mismatch: exit 1",
             'print("ran on", device, "and agreed with the CPU")'] if compared else
            ['print("ran on", device, "(its outputs have undefined values: not compared)")'])
    return head + built + run + body + tail


def _packed(names: list[str], tensors: list[tuple[str, str]]) -> str:
    notes = ", ".join(f"{n} {note}" for n, (_, note) in zip(names, tensors) if note)
    return f"{', '.join(names)} = {', '.join(t for t, _ in tensors)}" + (
        f"  # the step's strides: {notes}" if notes else "")


def _name(i: int) -> str:
    return NAMES[i] if i < len(NAMES) else f"t{i}"


def _call_expr(probe: dict, names: list[str]) -> tuple[str, bool]:
    """(the call written in Python, whether it uses F); ValueError for an argument it cannot write."""
    spec = probe["spec"]
    args = [_arg(a, names) for a in spec.get("args", [])]
    kwargs = {k: _arg(v, names) for k, v in spec.get("kwargs", {}).items()}
    namespace, _, rest = probe["op"].partition("::")
    template = spelling(rest, spec.get("args", []), spec.get("kwargs", {})) if namespace == "aten" else None
    if template is not None:
        return template.format(*args), template.startswith("F.") or " F." in template
    name, _, overload = rest.partition(".")
    written = [*args, *(f"{k}={v}" for k, v in kwargs.items())]
    return f"torch.ops.{namespace}.{name}.{overload or 'default'}({', '.join(written)})", False


def _arg(value, names: list[str]) -> str:
    """One recorded argument (trace/argspec.py's encoding) as Python source."""
    if isinstance(value, list):
        items = [_arg(v, names) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if not isinstance(value, dict):
        return repr(value)
    if "t" in value:
        return names[value["t"]]
    (tag, payload), = value.items()
    if tag == "float":
        return f"float({str(payload)!r})"
    if tag == "complex":
        return f"complex({payload[0]!r}, {payload[1]!r})"
    if tag in ("dtype", "layout", "memory_format"):
        return f"torch.{payload}"
    if tag == "device":
        return f"{names[0]}.device" if names else '"cpu"'
    raise ValueError(f"cannot write an argument of type {tag}")


def _tensor(i: int, spec: dict, inline: dict | None) -> tuple[str, str] | None:
    """(the expression that builds the tensor, a comment on its recorded strides or "") — None: a dtype the snippet
    cannot build."""
    dtype, shape = spec["dtype"], list(spec["shape"])
    size = ", ".join(map(str, shape)) if shape else "()"
    note = _layout_note(shape, list(spec.get("stride") or []))
    values = spec.get("values")
    if values is None and inline is not None:
        values = _unpacked(inline, dtype)
    if dtype in FLOATING:
        positive = values is not None and all(v >= 0 for v in _flat(values))
        kind = "rand" if positive else "randn"
        suffix = "" if dtype == "float32" else f", dtype=torch.{dtype}"
        return f"torch.{kind}({size}{suffix})", note
    if dtype in _COMPLEX:
        return f"torch.randn({size}, dtype=torch.{dtype})", note
    if dtype not in PACKED:
        return None
    return _integer(dtype, shape, size, values), note


def _integer(dtype: str, shape: list, size: str, values) -> str:
    suffix = "" if dtype == "int64" else f", dtype=torch.{dtype}"
    flat = list(_flat(values)) if values is not None else None
    if flat is not None and len(flat) <= INLINE_VALUES:
        literal = repr(values) if shape else repr(flat[0])
        return f"torch.tensor({literal}{suffix})"
    if flat is None:
        return f"torch.zeros({size}{suffix})"  # the full script's integers without recorded values
    if dtype == "bool":
        return f"torch.rand({size}) > 0.5"
    low, high = int(min(flat)), int(max(flat))
    return f"torch.randint({low}, {high + 1}, ({size}{',' if len(shape) == 1 else ''}){suffix})"


def _layout_note(shape: list, stride: list) -> str:
    """The recorded strides when they are not the dense ones (an expanded or strided tensor), else ""."""
    expected, dense = 1, []
    for size in reversed(shape):
        dense.insert(0, expected)
        expected *= max(size, 1)
    if not stride or all(st == d for size, st, d in zip(shape, stride, dense) if size > 1):
        return ""
    return str(stride)


def _unpacked(inline: dict, dtype: str):
    if "values" in inline:
        return inline["values"]
    if dtype not in PACKED:
        return None
    raw = zlib.decompress(base64.b64decode(inline["zlib_base64"]))
    width = struct.calcsize(PACKED[dtype])
    return list(struct.unpack(f"<{len(raw) // width}{PACKED[dtype]}", raw))


def _flat(values):
    if isinstance(values, list):
        for v in values:
            yield from _flat(v)
    else:
        yield values
