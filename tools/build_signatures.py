"""Write opscan/knowledge/signatures.txt: the arguments of every aten overload's schema in each covered release.

    python tools/build_signatures.py --wheel-dir /work/wheels          # every release of index.txt
    python tools/build_signatures.py --wheel-dir /work/wheels --check  # compare with the shipped table
    python tools/build_signatures.py --installed --check               # the installed torch's column, no network

Each release's macOS wheel (downloaded into --wheel-dir when absent, checked against index.txt's sha256) gives its
torchgen/packaged/ATen/native/native_functions.yaml; every `func:` schema's argument names and defaults
(knowledge/yaml_index.py schema_arguments) make the release's column. The conditions of the knowledge files read
these names (predict/bind.py binds a call's arguments to them), so no file keeps argument names by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zipfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from table_output import write_or_check  # noqa: E402

from opscan.knowledge.build import YAML, read_installed  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402
from opscan.knowledge.signatures import SIGNATURES_PATH, Argument, format_signatures, load_signatures  # noqa: E402
from opscan.knowledge.yaml_index import schema_arguments  # noqa: E402

HEADER = """# opscan: the arguments of every aten overload's schema in each covered release (native_functions.yaml
# `func:`, and the out= overloads `autogen:` makes), as predict/bind.py names a call's arguments for the knowledge
# files' conditions. Written by tools/build_signatures.py from each release's macOS arm64 wheel.
# OP RELEASES ARG ... (ARG: name, or name=default as the schema spells it; -: none)"""
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def arguments_of(yaml_text: str) -> dict[str, tuple[Argument, ...]]:
    """op (yaml name) -> its arguments, for every `func:` of a native_functions.yaml and every out= overload its
    `autogen:` fields make (torchgen: the functional schema's arguments, then `out`, or `out0`, `out1`, ... for
    several returned tensors)."""
    entries = yaml.load(yaml_text, Loader=_LOADER)  # noqa: S506 - _LOADER is PyYAML's safe loader
    out = {e["func"].partition("(")[0].strip(): tuple(Argument(n, d) for n, d in schema_arguments(e["func"]))
           for e in entries}
    for entry in entries:
        returns = _returned(entry["func"])
        outs = ("out",) if returns == 1 else tuple(f"out{i}" for i in range(returns))
        for name in (n.strip() for n in str(entry.get("autogen") or "").split(",")):
            if name.endswith("out") and name not in out:
                out[name] = out[entry["func"].partition("(")[0].strip()] + tuple(Argument(o) for o in outs)
    return out


def _returned(func: str) -> int:
    """How many tensors a schema returns ("-> Tensor": 1, "-> (Tensor, Tensor)": 2, "-> ()": 0)."""
    returns = func.rpartition("->")[2].strip()
    inside = returns[1:-1].strip() if returns.startswith("(") else returns
    return len([r for r in inside.split(",") if r.strip()])


def build(folder: str, releases: list[str], python_version: str) -> dict[str, dict[str, tuple[Argument, ...]]]:
    """release -> op -> arguments (wheels from `folder`, downloaded when absent)."""
    from build_kernel_checks import wheel_path

    lines = {line.release: line for line in load_store().index}
    out = {}
    for release in releases:
        with zipfile.ZipFile(wheel_path(lines[release], folder, python_version)) as zf:
            out[release] = arguments_of(zf.read(YAML).decode("utf-8"))
        print(f"build_signatures: torch {release}: {len(out[release])} schemas", file=sys.stderr)
    return out


def check_installed(path: str) -> int:
    """The shipped table's column for the installed release equals the installed native_functions.yaml's."""
    from opscan.knowledge import installed_release

    release, text = installed_release(), read_installed().yaml
    table = load_signatures(path)
    if release not in table.releases:
        print(f"build_signatures: torch {release} is not in {path}", file=sys.stderr)
        return 1
    found = arguments_of(text)
    bad = sorted(op for op in set(found) | set(table.by_release[release])
                 if table.arguments(op, release) != found.get(op))
    print(f"build_signatures: {path} {'differs' if bad else 'matches'} for the installed torch {release}"
          + (f": {', '.join(bad[:5])}" if bad else ""))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) signatures.txt."""
    p = argparse.ArgumentParser(prog="build_signatures.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel-dir", help="where the macOS wheels are (and are downloaded to); default: a temp folder")
    p.add_argument("--python-version", default="3.11", help="wheel tag to download (default 3.11)")
    p.add_argument("--output", default=SIGNATURES_PATH)
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    p.add_argument("--installed", action="store_true", help="with --check: only the installed release's column")
    args = p.parse_args(argv)
    if args.installed:
        return check_installed(args.output) if args.check else 2
    covered = [line.release for line in load_store().index]
    with tempfile.TemporaryDirectory(prefix="opscan-sig-") as tmp:
        folder = os.path.abspath(args.wheel_dir or tmp)
        found = build(folder, covered, args.python_version)
    load_signatures.cache_clear()
    return write_or_check("build_signatures", args.output, format_signatures(covered, found, HEADER), args.check)


if __name__ == "__main__":
    raise SystemExit(main())
