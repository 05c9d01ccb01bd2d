#!/usr/bin/env python3
"""Rebuild opscan/knowledge/autocast_mps.txt: the AutocastMPS policy and GradScaler's MPS path of each covered
torch release, read from that release's macOS arm64 wheel.

    python tools/build_autocast_mps.py --wheel-dir ~/.cache/opscan-wheels          # every release of index.txt
    python tools/build_autocast_mps.py --wheel-dir DIR --check                     # compare with the shipped file

Wheels are found (or pip-downloaded) and sha256-checked as tools/build_kernel_checks.py does. From each wheel:

* torch/lib/libtorch_cpu.dylib: every `TORCH_LIBRARY_IMPL_init_<ns>_AutocastMPS_<n>` function (the bodies of
  `TORCH_LIBRARY_IMPL(aten|_, AutocastMPS, m)`, aten/src/ATen/autocast_mode.cpp). Each
  `m.impl("op.overload", &WrapFunction<CastPolicy::P, DeviceType::MPS, ..., &at::_ops::<op>::call>::call)` compiles
  to an ADRP+ADD (or ADR) of the op-name C string and of the kernel's code address before a BL to
  `torch::Library::_impl`; the kernel's mangled name carries the policy P, the device and the op it redispatches
  to (checked: it is the op the name string names). `m.fallback(...)` is read the same way (a fallthrough);
* the same dylib: entry 13 (DeviceType::MPS) of the thread-local template `at::autocast::autocast_dtype`: the
  default `torch.get_autocast_dtype("mps")`;
* torch/include/ATen/autocast_mode.h: the CastPolicy enum (its order names P);
* torch/amp/autocast_mode.py: what `torch.autocast("mps", dtype=...)` does — raises (no mps branch, or
  is_autocast_available lacks kMPS), which dtypes it accepts, what it does with another (warns and disables),
  and whether its macOS-14 test for bfloat16 is reachable (in the mps branch: 2.6-2.9; inside the
  unsupported-dtype branch, hence dead: 2.10-2.12; gone: 2.13+);
* torch/amp/grad_scaler.py: how `GradScaler.unscale_` inverts an MPS scale: absent (no torch.amp.GradScaler),
  `double` (`self._scale.double()`: MPS has no float64, TypeError on a Mac) or `mps-branch` (float32
  `reciprocal` when the scale is on mps:0), with the line.

Releases with the same reading form one group of the table (opscan/knowledge/autocast.py reads it).
Exit codes: 0 done (with --check: the shipped file matches), 1 --check found a difference, 2 usage or download
error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from table_output import write_or_check  # noqa: E402

from opscan.knowledge.autocast import TABLE_PATH, AutocastGroup, format_autocast_table  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402

DYLIB = "torch/lib/libtorch_cpu.dylib"
HEADER = "torch/include/ATen/autocast_mode.h"
AUTOCAST_PY = "torch/amp/autocast_mode.py"
SCALER_PY = "torch/amp/grad_scaler.py"
MPS = 13  # c10::DeviceType::MPS in every covered release
SCALAR_TYPES = {0: "Undefined?", 5: "float16", 6: "float32", 7: "float64", 15: "bfloat16"}
_WRAP = re.compile(r"WrapFunction_IL.{0,40}?CastPolicyE(\d+)ELN3c1010DeviceTypeE(\d+)E")
_OPS = re.compile(r"_ops(\d+)")


def cast_policies(header: str) -> list[str]:
    """The CastPolicy enumerators in order (empty when the header has no enum: 2.0 kept it in the .cpp)."""
    found = re.search(r"enum class CastPolicy[^{]*\{(.*?)\};", header, re.S)
    if found is None:
        return []
    body = re.sub(r"//[^\n]*", "", found.group(1))
    return [n.split("=")[0].strip() for n in body.split(",") if n.strip()]


def registrations(image) -> list[dict]:
    """Every m.impl / m.fallback of the AutocastMPS library bodies: op string, kernel, policy, redispatch."""
    impl = {i for i, n in enumerate(image.names) if "7Library5_impl" in n}
    fallback = {i for i, n in enumerate(image.names) if "7Library9_fallback" in n or "7Library8fallback" in n}
    text_lo, text_size, _ = image.text
    out = []
    for fn, name in enumerate(image.names):
        if "AutocastMPS" not in name or "TORCH_LIBRARY_IMPL_init" not in name:
            continue
        calls, addresses = image.decode(fn)
        op, code, other = None, [], []
        for k in range(calls.size):
            target = int(addresses[k])
            if target >= 0:
                if text_lo <= target < text_lo + text_size:
                    code.append(target)
                elif (found := image.cstring(target)) is not None:
                    op = found
            if calls[k] < 0:
                continue
            callee = image.function_at(int(calls[k]))
            if callee in impl or callee in fallback:
                out.append(_decoded(image, "impl" if callee in impl else "fallback", op, code, other))
                op, code, other = None, [], []
            elif callee >= 0:
                other.append(image.names[callee])
    return out


def _decoded(image, kind: str, op: str | None, code: list[int], other: list[str]) -> dict:
    kernels = [image.names[image.function_at(a)] for a in code if image.starts[image.function_at(a)] == a]
    entry = {"kind": kind, "op": op.removeprefix("aten::") if op else None}
    if any("makeFallthrough" in n or "fallthrough_kernel" in n for n in kernels + other):
        return {**entry, "kernel": "fallthrough"}
    wraps = [k for k in kernels if "WrapFunction_" in k and "4callE" in k]
    if not wraps:
        return {**entry, "kernel": kernels[-1] if kernels else None}
    found = _WRAP.search(wraps[-1])
    ops = _OPS.search(wraps[-1])
    redispatch = wraps[-1][ops.end():ops.end() + int(ops.group(1))] if ops else None
    return {**entry, "kernel": "WrapFunction_", "policy": int(found.group(1)), "device": int(found.group(2)),
            "redispatch": redispatch}


def default_dtype(image) -> str:
    """autocast_dtype's initial value for MPS, from its thread-local init template."""
    address = image.data_symbol("autocast_dtypeE$tlv$init")
    value = None if address is None else image.byte_at(address + MPS)
    return "-" if value is None else SCALAR_TYPES.get(value, f"ScalarType({value})")


def python_gate(source: str, header: str) -> dict[str, str]:
    """How torch/amp/autocast_mode.py treats device 'mps' (see the module docstring)."""
    if "is_autocast_available(self.device)" in source:
        supported = re.search(r"_AUTOCAST_SUPPORTED_DEVICES[^;]*;", header, re.S)  # 2.6+: a list beside it
        listed = "kMPS" in (supported or re.search(r"bool is_autocast_available\(.*?\n\}", header, re.S)).group(0)
        message = "User specified an unsupported autocast device_type 'mps'"
    else:
        listed = 'self.device == "mps"' in source
        found = re.search(r"raise RuntimeError\(\s*f?(['\"])(User specified.*?)\1\s*\)", source, re.S)
        message = found.group(2).replace("\\'", "'").replace("{self.device}", "mps") if found else "?"
    if not listed:
        return {"available": "no", "raises": f"RuntimeError: {message}"}
    block = re.search(r'elif self\.device == "mps":\n(.*?)\n        elif', source, re.S)
    if block:
        dtypes = re.search(r"supported_dtype = \[(.*?)\]", block.group(1)).group(1)
        gate = "14.0" if "is_macos_or_newer(14, 0)" in block.group(1) else "-"
    else:
        dtypes = re.search(r"device_supported_dtypes = \[(.*?)\]", source).group(1)
        generic = re.search(r"elif self\.fast_dtype not in device_supported_dtypes:(.*?)self\._enabled = enabled",
                            source, re.S)
        gate = "unreachable" if generic and "is_macos_or_newer(14" in generic.group(1) else "-"
    names = sorted(d.strip().removeprefix("torch.") for d in dtypes.split(","))
    other = "warns and disables autocast" if "Disabling autocast" in source else "?"
    return {"available": "yes", "dtypes": " ".join(names), "other_dtype": other, "bfloat16_macos": gate}


def scaler_path(source: str | None) -> str:
    """How GradScaler.unscale_ inverts the scale on mps (see the module docstring), with the line."""
    if source is None:
        return "absent"
    lines = source.splitlines()
    at = next((i + 1 for i, line in enumerate(lines) if "self._scale.double().reciprocal()" in line), None)
    if any('torch.device("mps:0")' in line for line in lines):
        return f"mps-branch {SCALER_PY}:{at}"
    return f"double {SCALER_PY}:{at}"


def read_release(path: str) -> dict:
    """One wheel's reading: the Python gates, the default dtype, the policy of every op, GradScaler's path."""
    import arm64_image  # numpy: only the binary side needs it

    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        header = zf.read(HEADER).decode("utf-8")
        source = zf.read(AUTOCAST_PY).decode("utf-8")
        scaler = zf.read(SCALER_PY).decode("utf-8") if SCALER_PY in names else None
        image = arm64_image.load(zf.read(DYLIB))
    policies = cast_policies(header)
    ops, other, mismatched = {}, [], []
    for r in registrations(image):
        if r["kind"] == "impl" and r.get("kernel") == "WrapFunction_" and r.get("device") == MPS:
            ops[r["op"]] = policies[r["policy"]]
            base, _, overload = r["op"].partition(".")
            if r["redispatch"] != (f"{base}_{overload}" if overload else base):
                mismatched.append(f"{r['op']}->{r['redispatch']}")
        else:
            other.append(f"{r['kind']} {r['op'] or '(all ops)'} -> {r.get('kernel')}")
    if mismatched:
        raise SystemExit(f"build_autocast_mps: {path}: op strings and kernels disagree: {' '.join(mismatched)}")
    gate = python_gate(source, header)
    return {**gate, "default_dtype": default_dtype(image) if ops else "-", "gradscaler": scaler_path(scaler),
            "registrations": "; ".join(sorted(other)) or "-", "ops": ops}


def build(folder: str, python_version: str, log=print) -> str:
    """The text of autocast_mps.txt from every release of the knowledge base."""
    from build_kernel_checks import wheel_path

    groups: list[AutocastGroup] = []
    for line in load_store().index:
        found = read_release(wheel_path(line, folder, python_version))
        log(f"build_autocast_mps: torch {line.release}: {len(found['ops'])} ops, {found['gradscaler']}")
        fields = {k: v for k, v in found.items() if k != "ops"}
        if groups and groups[-1].fields == fields and groups[-1].ops == found["ops"]:
            groups[-1] = AutocastGroup(groups[-1].releases + (line.release,), fields, found["ops"])
        else:
            groups.append(AutocastGroup((line.release,), fields, found["ops"]))
    return format_autocast_table(groups)


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) autocast_mps.txt."""
    p = argparse.ArgumentParser(prog="build_autocast_mps.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel-dir", required=True, help="where the macOS wheels are (and are downloaded to)")
    p.add_argument("--python-version", default="3.11", help="wheel tag to download (default 3.11)")
    p.add_argument("--output", default=TABLE_PATH)
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    args = p.parse_args(argv)
    os.makedirs(args.wheel_dir, exist_ok=True)
    text = build(os.path.abspath(args.wheel_dir), args.python_version,
                 log=lambda msg: print(msg, file=sys.stderr))
    return write_or_check("build_autocast_mps", args.output, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
