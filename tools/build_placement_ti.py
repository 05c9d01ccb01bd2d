#!/usr/bin/env python3
"""Rebuild opscan/knowledge/placement_ti.txt: the structured ops whose meta function builds a TensorIterator.

An overload declared with `structured_inherits: TensorIteratorBase` in native_functions.yaml has a meta class that
is a TensorIterator: its meta function (the same on every device, run before the MPS kernel) builds the iterator
over the call's tensors, and TensorIteratorBase::compute_types refuses a tensor on another device than the
others, a CPU tensor beside MPS ones included ("Expected all tensors to be on the same device, but found at least
two devices, mps:0 and cpu!"), except one 0-dim CPU input where the config allows CPU scalars
(knowledge/placement.yaml, rule `tensor-iterator`).

    python tools/build_placement_ti.py [--yaml PATH] [--check]

The yaml is the installed torch's (torchgen/packaged/ATen/native/native_functions.yaml of the wheel) unless
--yaml names one; the file records its release and sha256. Exit codes: 0 done (with --check: the shipped file
matches), 1 --check found a difference, 2 usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import yaml  # noqa: E402
from table_output import write_or_check  # noqa: E402

from opscan.knowledge.placement import TI_PATH  # noqa: E402

HEADER = """\
# opscan: the structured overloads whose meta class inherits TensorIteratorBase (native_functions.yaml
# `structured_inherits: TensorIteratorBase`): their meta function builds a TensorIterator, which refuses a CPU
# tensor beside MPS ones (knowledge/placement.yaml, rule tensor-iterator). Written by tools/build_placement_ti.py
# from the native_functions.yaml named below; an overload delegating to one of these (`structured_delegate`) shares
# its meta function.
"""


def table(text: str, release: str) -> str:
    """placement_ti.txt for one native_functions.yaml text."""
    entries = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    names = sorted(e["func"].split("(", 1)[0] for e in entries
                   if isinstance(e, dict) and e.get("structured_inherits") == "TensorIteratorBase")
    sha = hashlib.sha256(text.encode()).hexdigest()
    return HEADER + f"release {release} sha256 {sha}\n" + "".join(f"{n}\n" for n in names)


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yaml", help="a native_functions.yaml (default: the installed torch's)")
    parser.add_argument("--release", help="its torch release (default: the installed torch's)")
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    args = parser.parse_args(argv)
    from opscan.knowledge import default_yaml_path, installed_release

    path = args.yaml or default_yaml_path()
    release = args.release or installed_release()
    if not os.path.isfile(path) or not release:
        print(f"build_placement_ti: no native_functions.yaml at {path} (or no release) — pass --yaml and --release",
              file=sys.stderr)
        return 2
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return write_or_check("build_placement_ti", TI_PATH, table(text, release), args.check)


if __name__ == "__main__":
    sys.exit(main())
