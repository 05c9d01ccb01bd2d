#!/usr/bin/env python3
"""Rebuild opscan/knowledge/kernel_checks.txt: every runtime check compiled into the MPS kernels of each
covered torch release, read from that release's macOS arm64 wheel.

    python tools/build_kernel_checks.py --wheel-dir ~/.cache/opscan-wheels          # every release of index.txt
    python tools/build_kernel_checks.py --wheel-dir DIR --check                     # compare with the shipped file

Wheels are looked for in --wheel-dir by the file name index.txt records and checked against its sha256; a
missing one is pip-downloaded there (as tools/build_kb.py does) and kept, so a rebuild reads the same bytes.
From each wheel the tool reads torch/lib/libtorch_cpu.dylib and native_functions.yaml:

* tools/macho_checks.py finds every call site of a failure function (TORCH_CHECK's torchCheckFail,
  the NotImplementedError / TypeError / ValueError / IndexError of TORCH_CHECK_NOT_IMPLEMENTED / _TYPE /
  _VALUE / _INDEX) that passes the path of a source file under aten/src/ATen/native/mps/, with its line
  (__LINE__, as compiled: the line in that release's source, commit = its git_version), the function
  containing it and its message literals. TORCH_WARN sites (CPU fallbacks with a warning) and
  TORCH_INTERNAL_ASSERTs are not refusals and are left out;
* a check belongs to the aten overloads whose MPS kernel (the yaml's `MPS:` name, or the
  `structured_<name>::impl` of a structured kernel) contains it or calls the function containing it
  (`via kernel` / `via caller`), else to the ops its function is named after (`via name`: stub
  kernels such as `hermite_polynomial_he_mps_kernel`), else to none (`via -`). Checks of the shared
  helpers (OperationUtils, MPSGraph utilities) are `via generic`: they are counted, not attached;
* `kind` is read from the message (the condition is not in the binary): dtype, rank, size, flag,
  macos, or other (device, layout, internal consistency: not decidable from a traced call).

Lines of the file (one check = one file, function, macro and message; the line and commit are those of
the newest release that has it):

    ID  MACRO  KIND  FILE:LINE  RELEASE  FUNCTION  VIA  RELEASES  OPS  MESSAGE      (tab-separated)

Exit codes: 0 done (with --check: the shipped file matches), 1 --check found a difference, 2 usage or
download error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import zipfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from macho_checks import callers, find_sites, function_name, load  # noqa: E402
from table_output import write_or_check  # noqa: E402

from opscan.knowledge.build import YAML  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402
from opscan.knowledge.kernel_checks import CHECKS_PATH, format_checks  # noqa: E402
from opscan.knowledge.sources import git_version  # noqa: E402

DYLIB = "torch/lib/libtorch_cpu.dylib"
GENERIC = ("OperationUtils", "MPSGraph", "MetalShaderLibrary", "TensorFactory", "Copy.h")
_NAME_SUFFIXES = ("_mps_kernel", "_kernel_mps", "_out_mps", "_mps_out", "_mps_", "_mps", "_kernel")


def wheel_path(line, folder: str, python_version: str) -> str:
    """The release's wheel in `folder` (downloaded when absent), checked against index.txt's sha256."""
    path = os.path.join(folder, line.wheel)
    if not os.path.isfile(path):
        from build_kb import download

        with tempfile.TemporaryDirectory(prefix="opscan-kc-", dir=folder) as tmp:
            os.replace(download(line.release, tmp, python_version), path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != line.wheel_sha256:
        raise SystemExit(f"build_kernel_checks: {path} does not have the sha256 index.txt records")
    return path


def mps_kernels(yaml_text: str) -> dict[str, set[str]]:
    """Kernel function name -> the overloads (yaml spelling) it serves on MPS, delegating ones included."""
    kernels: dict[str, set[str]] = defaultdict(set)
    delegates: dict[str, list[str]] = defaultdict(list)
    name, in_dispatch = None, False
    for raw in yaml_text.splitlines():
        if raw.startswith("- func:"):
            name = raw.split(":", 1)[1].strip().split("(", 1)[0]
            in_dispatch = False
        elif raw.startswith("  dispatch:"):
            in_dispatch = True
        elif raw.startswith("  structured_delegate:"):
            delegates[raw.split(":", 1)[1].strip()].append(name)
        elif in_dispatch and raw.startswith("    ") and ":" in raw:
            keys, kernel = raw.strip().split(":", 1)
            if "MPS" in [k.strip() for k in keys.split(",")]:
                kernels[kernel.strip()].add(name)
        elif not raw.startswith("    "):
            in_dispatch = False
    for ops in kernels.values():
        ops.update(d for op in list(ops) for d in delegates.get(op, ()))
    return kernels


def attach(site, kernel_ops: dict[str, set[str]], up: dict[str, set[str]], all_ops: set[str]):
    """(via, ops) of one site; see the module docstring."""
    if any(g in site.file for g in GENERIC):
        return "generic", set()
    own = function_name(site.symbol) or ""
    if own in kernel_ops:
        return "kernel", set(kernel_ops[own])
    found = {op for fn in up.get(site.symbol, ()) for op in kernel_ops.get(fn, ())}
    if found:
        return "caller", found
    base = own
    for suffix in _NAME_SUFFIXES:
        base = base.removesuffix(suffix)
    named = {op for op in all_ops if op.split(".", 1)[0] in (base, f"special_{base}")}
    return ("name", named) if named else ("-", set())


def read_release(line, folder: str, python_version: str) -> tuple[str, list[tuple]]:
    """(git_version, [(site, via, ops)]) of one release."""
    with zipfile.ZipFile(wheel_path(line, folder, python_version)) as zf:
        data = zf.read(DYLIB)
        yaml_text = zf.read(YAML).decode("utf-8")
        commit = git_version(zf.read("torch/version.py").decode("utf-8")) or "-"
    image = load(data)
    sites = [s for s in find_sites(data, image) if s.macro != "TORCH_WARN"]
    kernel_ops = mps_kernels(yaml_text)
    helpers = tuple({s.symbol for s in sites if (function_name(s.symbol) or "") not in kernel_ops
                     and not any(g in s.file for g in GENERIC)})
    up = callers(data, helpers, image=image)
    all_ops = set(re.findall(r"^- func: ([\w.]+)\(", yaml_text, re.M))
    return commit, [(s, *attach(s, kernel_ops, up, all_ops)) for s in sites]


def build(folder: str, python_version: str, log=print) -> str:
    """The text of kernel_checks.txt from every release of the knowledge base."""
    store = load_store()
    per_release = {}
    for line in store.index:
        per_release[line.release] = read_release(line, folder, python_version)
        log(f"build_kernel_checks: torch {line.release}: {len(per_release[line.release][1])} checks")
    return format_checks(store.releases(), per_release)


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) kernel_checks.txt."""
    p = argparse.ArgumentParser(prog="build_kernel_checks.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel-dir", required=True, help="where the macOS wheels are (and are downloaded to)")
    p.add_argument("--python-version", default="3.11", help="wheel tag to download (default 3.11)")
    p.add_argument("--output", default=CHECKS_PATH)
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    args = p.parse_args(argv)
    os.makedirs(args.wheel_dir, exist_ok=True)
    text = build(os.path.abspath(args.wheel_dir), args.python_version,
                 log=lambda msg: print(msg, file=sys.stderr))
    return write_or_check("build_kernel_checks", args.output, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
