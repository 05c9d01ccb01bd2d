#!/usr/bin/env python3
"""Rebuild opscan/knowledge/composite_callees.txt: which aten ops every C++ composite kernel of each covered torch
release calls, read from that release's macOS arm64 libtorch_cpu.dylib (no torch import, no build of the release).

    python tools/build_composite_callees.py --wheel-dir /work/wheels             # every release of index.txt
    python tools/build_composite_callees.py --wheel-dir DIR --check              # compare with the shipped file
    python tools/build_composite_callees.py --releases 2.5.0,2.14.1 --check      # those releases' rows only (CI)
    python tools/build_composite_callees.py --wheel-dir DIR --explain 2.5.0 _safe_softmax   # how it was found

Wheels are looked for in --wheel-dir by the file name index.txt records and checked against its sha256; a missing
one is pip-downloaded there (as tools/build_kb.py does). Without --wheel-dir they go to a temporary folder.

Which ops: every native_functions.yaml overload whose kernel is composite — a `CompositeImplicitAutograd` entry
or one with no `dispatch` section and no `structured_delegate` (torchgen's default), `CompositeExplicitAutograd`,
`CompositeExplicitAutogradNonFunctional` — and the `autogen:` out= overloads (torchgen writes a CEA kernel for
them). Where the body is: torchgen registers each through a generated wrapper `wrapper_<Key>_<overload>_<name>`
handed to the dispatcher as `c10::impl::wrap_kernel_functor_unboxed_<...&wrapper_...>::call`; that local symbol
ships in every wheel even when the wrapper and the native kernel are inlined into it, and its wrapper name maps
back to the yaml overload exactly (fallbacks: the wrapper itself, the boxed functor).

The walk (tools/macho_arm64.py's CallGraph: BL calls and tail jumps), from that root:
* a transfer to `at::_ops::<struct>::call` / `::redispatch` is a dispatched op: recorded, not followed
  (`<struct>`, torchgen's `<name>_<overload>`, is mapped back through the release's yaml);
* any other function of namespace `at` or `sdp`, a file-static function, a `.cold.N` part or an
  `_OUTLINED_FUNCTION_N` is followed, up to DEPTH at:: levels (cold and outlined parts cost none);
* everything else (c10, std, libc, imports, TensorIterator, DispatchStub kernels) is not followed.

Limits: a static over-approximation (every op some branch can dispatch, whatever the device); calls through
function pointers (DispatchStub), virtual calls (VariableHooks) and helpers deeper than DEPTH are not seen; the
macOS build's branches (no FBGEMM, no MKLDNN), which is what a Mac runs.

Exit codes: 0 done (with --check: the shipped file matches), 1 --check found a difference, 2 usage or download
error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from macho_arm64 import CallGraph, load, nested_names  # noqa: E402
from table_output import write_or_check  # noqa: E402

from opscan.knowledge.build import YAML  # noqa: E402
from opscan.knowledge.composite_callees import CALLEES_PATH, KIND_KEYS, Kernel, format_table, load_callees  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402

DYLIB = "torch/lib/libtorch_cpu.dylib"
DEPTH = 4  # at:: functions followed below the root (depth 5+ adds resize_output's generic helpers everywhere)
AUTOGEN = "<autogen>"
FOLLOWED = ("at", "sdp")  # sdp:: holds the attention helpers of ATen/native/transformers
NOT_FOLLOWED = ("TensorIterator", "TensorIteratorBase", "TensorIteratorConfig", "DispatchStub")
_WRAPPER = re.compile(r"_GLOBAL__N_1(\d+)wrapper_")
HEADER = """\
# opscan knowledge base: which aten ops each covered release's C++ composite kernels call. Written by
# tools/build_composite_callees.py from the libtorch_cpu.dylib of each release's macOS arm64 wheel (index.txt);
# format and meaning: opscan/knowledge/composite_callees.py. A static over-approximation: every op some branch
# of the kernel (or of a helper up to {depth} levels down) can dispatch. Review the diff, then commit.
"""


@dataclass(frozen=True)
class YamlOp:
    """One native_functions.yaml overload."""

    name: str  # yaml spelling: softmax.int, add_.Tensor, relu
    composite: str | None  # the composite key, or None
    kernel: str | None  # the C++ function the key names (AUTOGEN for an autogen out= overload)


def yaml_ops(text: str) -> dict[str, YamlOp]:
    """Every overload of a release's native_functions.yaml by torchgen's struct name (`softmax_int`)."""
    out = {}
    for entry in yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        name = entry["func"].split("(", 1)[0]
        composite, kernel = _composite(entry, name.partition(".")[0])
        out[name.replace(".", "_")] = YamlOp(name, composite, kernel)
        for generated in (v.strip() for v in (entry.get("autogen") or "").split(",") if v.strip()):
            out[generated.replace(".", "_")] = YamlOp(generated, "CompositeExplicitAutograd", AUTOGEN)
    return out


def _composite(entry: dict, name: str) -> tuple[str | None, str | None]:
    dispatch = entry.get("dispatch")
    if "dispatch" in entry and not dispatch:
        return None, None  # `dispatch: {}`: no C++ kernel (a Python-only op)
    if not dispatch:  # torchgen: no dispatch section (nor structured_delegate) means CompositeImplicitAutograd
        if entry.get("structured_delegate"):
            return None, None
        return "CompositeImplicitAutograd", None if entry.get("manual_cpp_binding") else name
    for keys, kernel in dispatch.items():
        for key in (k.strip() for k in keys.split(",")):
            if key in KIND_KEYS:
                return key, kernel
    return None, None


def roots(graph: CallGraph, ops: dict[str, YamlOp]) -> dict[str, list[int]]:
    """yaml op name -> the functions its composite kernel is entered through."""
    wanted: dict[str, YamlOp] = {}
    for op in ops.values():
        if op.composite:
            name, _, overload = op.name.partition(".")
            exact = f"{op.composite}_{overload}_{name}"
            if wanted.get(exact, op) is not op:
                raise SystemExit(f"build_composite_callees: wrapper {exact} fits {wanted[exact].name} and {op.name}")
            wanted[exact] = op
            wanted.setdefault(f"{exact}_out", op)  # the cpp name of an out= overload
    found: dict[str, list[int]] = {}
    fallback: dict[str, list[int]] = {}
    for fn, mangled in enumerate(graph.names):
        if "wrapper_Composite" not in mangled:
            continue
        wrapper = _wrapper_name(mangled)
        op = wanted.get(wrapper.removeprefix("wrapper_")) if wrapper else None
        if op is None:
            continue
        entry = "4callEPNS_14OperatorKernel" in mangled
        if mangled.startswith("_ZN3c104impl28wrap_kernel_functor_unboxed_") and entry:
            found.setdefault(op.name, []).append(fn)
        elif mangled.startswith("_ZN2at12_GLOBAL__N_1") or ("make_boxed_from_unboxed_functor" in mangled[:60]
                                                            and entry):
            fallback.setdefault(op.name, []).append(fn)
    for name, fns in fallback.items():
        found.setdefault(name, fns)
    return found


def _wrapper_name(mangled: str) -> str | None:
    match = _WRAPPER.search(mangled)
    if match is None:
        return None
    start = match.end() - len("wrapper_")
    return mangled[start:start + int(match.group(1))]


def classify(mangled: str) -> tuple[str, str | None]:
    """('op', struct) for at::_ops::X::call/redispatch; 'free' (cold/outlined part, a wrapper), 'follow', 'stop'."""
    if mangled.startswith("OUTLINED_FUNCTION_") or ".cold." in mangled or "wrapper_Composite" in mangled:
        return "free", None
    if mangled.startswith("_ZL"):  # a file-static function outside any namespace
        return "follow", None
    parts = nested_names(mangled)
    if not parts or parts[0] not in FOLLOWED:
        return "stop", None
    if len(parts) > 1 and parts[1] == "_ops":
        return ("op", parts[2]) if len(parts) > 3 and parts[3] in ("call", "redispatch") else ("stop", None)
    return ("stop", None) if any(p in NOT_FOLLOWED for p in parts[1:3]) else ("follow", None)


@dataclass
class Walk:
    """What one composite overload's kernel calls, and how it was found (--explain)."""

    callees: set[str] = field(default_factory=set)
    followed: dict[int, int] = field(default_factory=dict)  # function -> depth
    via: dict[str, int] = field(default_factory=dict)  # callee -> the function that called it
    cut: set[int] = field(default_factory=set)  # at:: functions left at the depth limit


def walk(graph: CallGraph, ops: dict[str, YamlOp], entry: list[int], depth: int = DEPTH) -> Walk:
    """The aten ops reachable from the entry functions (see the module docstring)."""
    found = Walk()
    todo = [(f, 0) for f in entry]
    while todo:
        fn, level = todo.pop()
        if found.followed.get(fn, depth + 1) <= level:
            continue
        found.followed[fn] = level
        for target in graph.transfers(fn):
            kind, struct = classify(graph.names[target])
            if kind == "op":
                callee = ops[struct].name if struct in ops else f"?{struct}"
                found.callees.add(callee)
                found.via.setdefault(callee, fn)
            elif kind == "free":
                todo.append((target, level))
            elif kind == "follow" and level + 1 > depth:
                found.cut.add(target)
            elif kind == "follow":
                todo.append((target, level + 1))
    found.cut -= set(found.followed)
    return found


def read_release(wheel: str, only: set[str] | None = None) -> tuple[dict[str, Kernel], dict[str, Walk], CallGraph]:
    """(op -> Kernel, op -> Walk, the call graph) of one wheel's composites (`only`: those ops)."""
    with zipfile.ZipFile(wheel) as zf:
        ops = yaml_ops(zf.read(YAML).decode("utf-8"))
        graph = CallGraph(load(zf.read(DYLIB)))
    entries = roots(graph, ops)
    kernels, walks = {}, {}
    for op in sorted({o.name: o for o in ops.values() if o.composite}.values(), key=lambda o: o.name):
        if only and op.name not in only:
            continue
        if op.name in entries:
            walks[op.name] = walk(graph, ops, entries[op.name])
            kernels[op.name] = Kernel(KIND_KEYS[op.composite], frozenset(walks[op.name].callees))
        else:  # the autogen out= overload of a CIA op: torchgen writes no kernel, no dylib has a body
            kernels[op.name] = Kernel(KIND_KEYS[op.composite], None)
    return kernels, walks, graph


def build(folder: str, releases: list[str], python_version: str, log) -> dict[str, dict[str, Kernel]]:
    """release -> op -> Kernel for `releases` (wheels from `folder`, downloaded when absent)."""
    from build_kernel_checks import wheel_path

    lines = {line.release: line for line in load_store().index}
    out = {}
    for release in releases:
        start = time.perf_counter()
        out[release] = read_release(wheel_path(lines[release], folder, python_version))[0]
        unknown = sum(k.callees is None for k in out[release].values())
        log(f"build_composite_callees: torch {release}: {len(out[release])} composite overloads "
            f"({unknown} without a body) in {time.perf_counter() - start:.1f} s")
    return out


def check_subset(found: dict[str, dict[str, Kernel]], path: str) -> int:
    """--check with --releases: the shipped table's rows for those releases equal the rebuilt ones."""
    from opscan.knowledge.composite_callees import load_callees as load

    shipped = load(path)
    bad = [f"{release} {op}" for release, table in found.items()
           for op in sorted(set(table) | set(shipped.kernels.get(release, {})))
           if shipped.kernel(op, release) != table.get(op)]
    print(f"build_composite_callees: {path} {'differs' if bad else 'matches'} for torch {', '.join(found)}"
          + (f": {len(bad)} rows ({', '.join(bad[:5])}...)" if bad else ""))
    return 1 if bad else 0


def explain(wheel: str, op: str) -> None:
    """Print how `op`'s callees were found in `wheel` (demangled through c++filt when present)."""
    import shutil
    import subprocess

    kernels, walks, graph = read_release(wheel, {op})
    found = walks.get(op)
    if found is None:
        print(f"{op}: {kernels.get(op, 'not a composite in this release')}")
        return

    def name(fn: int) -> str:
        mangled = "_" + graph.names[fn]
        if not shutil.which("c++filt"):
            return mangled
        return subprocess.run(["c++filt", "-_"], input=mangled, text=True, capture_output=True).stdout.strip()[:160]

    print(f"{op}: {' '.join(sorted(found.callees))}")
    for fn, level in sorted(found.followed.items(), key=lambda kv: kv[1]):
        print(f"  {level} {name(fn)}")
    for callee, fn in sorted(found.via.items()):
        print(f"  {callee:32} <- {name(fn)[:110]}")
    print(f"  {len(found.cut)} at:: functions left at depth {DEPTH}")


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) composite_callees.txt."""
    p = argparse.ArgumentParser(prog="build_composite_callees.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel-dir", help="where the macOS wheels are (and are downloaded to); default: a temp folder")
    p.add_argument("--python-version", default="3.11", help="wheel tag to download (default 3.11)")
    p.add_argument("--releases", help="comma-separated releases (with --check: compare only their rows)")
    p.add_argument("--output", default=CALLEES_PATH)
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    p.add_argument("--explain", nargs=2, metavar=("RELEASE", "OP"), help="show how one op's callees are found")
    args = p.parse_args(argv)
    covered = [line.release for line in load_store().index]
    releases = args.releases.split(",") if args.releases else covered
    if any(r not in covered for r in releases) or (args.releases and not args.check):
        print("build_composite_callees: --releases takes covered releases (index.txt), and only with --check "
              "(the shipped table holds every release)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="opscan-cc-") as tmp:
        folder = os.path.abspath(args.wheel_dir or tmp)
        os.makedirs(folder, exist_ok=True)
        if args.explain:
            from build_kernel_checks import wheel_path

            line = next(x for x in load_store().index if x.release == args.explain[0])
            explain(wheel_path(line, folder, args.python_version), args.explain[1])
            return 0
        found = build(folder, releases, args.python_version, lambda msg: print(msg, file=sys.stderr))
    if args.releases:
        return check_subset(found, args.output)
    text = format_table(covered, found, HEADER.format(depth=DEPTH))
    load_callees.cache_clear()
    return write_or_check("build_composite_callees", args.output, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
