#!/usr/bin/env python3
"""Build opscan/knowledge/py_drift.txt: the normalized-body hash of torch's Python functions in every release.

    python tools/build_py_drift.py --wheels /work/wheels     # the wheels releases/index.txt names, from a folder
    python tools/build_py_drift.py                           # pip-download each release's macOS arm64 wheel
    python tools/build_py_drift.py --check [--wheels DIR]    # rebuild and compare with the shipped table
    python tools/build_py_drift.py --installed               # compare the installed torch's column only
    python tools/build_py_drift.py --report                  # the drifted units of the scope list, as markdown

Covered units (opscan/knowledge/pynorm.py: a function or method, "file:qualname"), in every release that has
them: all of torch/optim/*.py, torch/nn/functional.py, torch/functional.py, torch/_tensor.py, torch/amp/*.py,
torch/nn/utils/clip_grad.py and torch/utils/_foreach_utils.py; the forward, _conv_forward, _check_input_dim and
_verify_batch_size methods of torch/nn/modules/*.py; and the units tools/py_drift_scope.txt lists (the functions
recorded steps executed elsewhere in torch). Each wheel is read as a zip (never installed) after its sha256 is
checked against releases/index.txt; a downloaded wheel goes to a temporary folder.

--installed needs no network: the installed torch's own files, hashed, must equal the table's column for the
installed release (tests/test_py_drift.py runs the same check). Exit codes: 0 done or matching, 1 --check or
--installed found a difference, 2 usage or download error.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from build_kb import download, sha256_file  # noqa: E402
from table_output import write_or_check  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402
from opscan.knowledge.py_drift import (  # noqa: E402
    PY_DRIFT_PATH, format_py_drift, installed_hash, load_py_drift, load_py_review, parse_py_drift)
from opscan.knowledge.pynorm import unit_hashes  # noqa: E402
from opscan.opkey import Release  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCOPE = os.path.join(HERE, "py_drift_scope.txt")
FAMILIES = ("torch/optim/*.py", "torch/nn/functional.py", "torch/functional.py", "torch/_tensor.py",
            "torch/amp/*.py", "torch/nn/utils/clip_grad.py", "torch/utils/_foreach_utils.py")
MODULES = "torch/nn/modules/*.py"
MODULE_METHODS = (".forward", "._conv_forward", "._check_input_dim", "._verify_batch_size")
HEADER = """# opscan knowledge base: the normalized-body hash (opscan/knowledge/pynorm.py) of torch's Python functions
# in every covered release, read from the macOS arm64 wheels of releases/index.txt (sha256 checked). Each field
# RELEASE=HASH holds from RELEASE up to the next field's release; "-": the function does not exist there.
# Written by tools/build_py_drift.py; opscan/knowledge/py_drift.py reads it.
"""

def scope_units() -> dict[str, set[str]]:
    """file -> qualnames of tools/py_drift_scope.txt."""
    out: dict[str, set[str]] = {}
    with open(SCOPE, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#"):
                rel, _, qualname = line.partition(":")
                out.setdefault(rel, set()).add(qualname)
    return out


def _wanted(rel: str, qualname: str, listed: set[str]) -> bool:
    if any(fnmatch.fnmatch(rel, g) for g in FAMILIES) or qualname in listed:
        return True
    return fnmatch.fnmatch(rel, MODULES) and qualname.endswith(MODULE_METHODS)


def release_hashes(source_of, names, listed: dict[str, set[str]]) -> dict[str, str]:
    """unit -> hash for one release; `source_of(rel)` reads a file of it, `names` are its files."""
    out = {}
    for rel in sorted(names):
        covered = any(fnmatch.fnmatch(rel, g) for g in (*FAMILIES, MODULES))
        if not covered and rel not in listed:
            continue
        for qualname, digest in unit_hashes(source_of(rel)).items():
            if _wanted(rel, qualname, listed.get(rel, set())):
                out[f"{rel}:{qualname}"] = digest
    return out


def read_release(wheel: str, listed) -> dict[str, str]:
    """unit -> hash of one wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith("torch/") and n.endswith(".py")]
        return release_hashes(lambda rel: zf.read(rel).decode("utf-8", "replace"), names, listed)


def wheel_of(line, folder: str | None, tmp: str, python_version: str) -> str:
    """The release's wheel (from `folder`, else downloaded into `tmp`), its sha256 checked."""
    path = os.path.join(folder, line.wheel) if folder else ""
    if not os.path.isfile(path):
        path = download(line.release, tempfile.mkdtemp(dir=tmp), python_version)
    if line.wheel_sha256 != "-" and sha256_file(path) != line.wheel_sha256:
        raise SystemExit(f"build_py_drift: {path} is not the wheel releases/index.txt names for {line.release}")
    return path


def build(folder: str | None, python_version: str) -> str:
    """The text of py_drift.txt from every release's wheel."""
    listed = scope_units()
    index = sorted(load_store().index, key=lambda line: Release.parse(line.release))
    per_unit: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="opscan-pydrift-") as tmp:
        for line in index:
            print(f"build_py_drift: reading {line.release}", file=sys.stderr)
            for unit, digest in read_release(wheel_of(line, folder, tmp, python_version), listed).items():
                per_unit.setdefault(unit, {})[line.release] = digest
    return format_py_drift([line.release for line in index], per_unit, HEADER)


def check_installed() -> int:
    """Compare the installed torch's hashes with the table's column for its release; 0 when equal."""
    import torch

    table = load_py_drift()
    release = Release.drop_local(str(torch.__version__))
    if table is None or release not in table.releases:
        print(f"build_py_drift: the table does not cover the installed torch {release}")
        return 1
    wrong = [u for u in table.rows if installed_hash(u) != table.hash_in(u, release)]
    for unit in wrong[:20]:
        print(f"  {unit}: installed {installed_hash(unit)}, table {table.hash_in(unit, release)}")
    print(f"build_py_drift: {len(table.rows) - len(wrong)} of {len(table.rows)} units of torch {release} match")
    return 1 if wrong else 0


def report() -> int:
    """Markdown rows: every unit of the scope list or the families that the recorded steps ran and that differs in
    some release, and what covers each difference (an earlier_paths fact, a same-ops review, or nothing)."""
    from opscan.knowledge.facts import load_facts

    table, review, facts = load_py_drift(), load_py_review(), load_facts()
    paths = [p for s in facts.sections["earlier_paths"].values() for p in s if p.from_unit]
    listed = {f"{rel}:{q}" for rel, qs in scope_units().items() for q in qs}
    for unit in sorted(u for u in table.rows if u in listed and len(table.rows[u]) > 1):
        runs = ", ".join(f"{table.releases[i]}{' (absent)' if d is None else ''}" for i, d in table.rows[unit])
        by_fact = sorted({f"`{p.op or 'a run'}`" for p in paths if unit in (p.from_unit, p.via)})
        reviewed = "; ".join(dict.fromkeys(c.reason for c in review.get(unit, ())))
        covered = " ".join(filter(None, (f"fact: {', '.join(by_fact)}" if by_fact else "",
                                          "same ops" if reviewed else "")))
        print(f"| `{unit}` | {runs} | {covered or '**unreviewed**: said in the scans'} | {reviewed or '—'} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", help="a folder holding the wheels releases/index.txt names")
    parser.add_argument("--check", action="store_true", help="compare with the shipped table instead of writing")
    parser.add_argument("--installed", action="store_true", help="check the installed torch's column (no network)")
    parser.add_argument("--report", action="store_true", help="print the drifted scope-list units as markdown")
    parser.add_argument("--python-version", default="3.11", help="the wheels' Python version (pip download)")
    args = parser.parse_args(argv)
    if args.installed:
        return check_installed()
    if args.report:
        return report()
    text = build(args.wheels, args.python_version)
    parse_py_drift(text)  # what is written must read back
    return write_or_check("build_py_drift", PY_DRIFT_PATH, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
