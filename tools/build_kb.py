#!/usr/bin/env python3
"""Rebuild one release's entry of opscan's MPS knowledge base from public artifacts.

    python tools/build_kb.py 2.14.1                 # pip-download the macOS arm64 wheel, write the entry
    python tools/build_kb.py 2.14.1 --wheel W.whl   # use a wheel already downloaded
    python tools/build_kb.py 2.14.1 --installed --check   # parse the installed torch's files, compare

The wheel (`pip download --no-deps --only-binary=:all: --platform macosx_14_0_arm64
--python-version 3.11 torch==X`, `macosx_11_0_arm64` for releases before 2.12) goes to a temporary
folder, never into the repository. From it the tool reads native_functions.yaml,
torch/backends/mps/__init__.py, torch/testing/_internal/common_mps.py and torch/version.py, writes
opscan/knowledge/releases/<release>.txt (records added and removed against the newest older entry)
and its line of releases/index.txt. A patch release whose records equal an entry of its series
shares that entry (only its index line is written). Review the diff, then commit.

Exit codes: 0 done (with --check: the shipped entry matches), 1 --check found a difference,
2 usage or download error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opscan.knowledge.build import EntryPlan, plan_entry, read_installed, read_wheel  # noqa: E402
from opscan.knowledge.entry import RELEASES_DIR, format_index, load_store  # noqa: E402
from opscan.opkey import Release  # noqa: E402

PLATFORMS = ("macosx_14_0_arm64", "macosx_11_0_arm64")


def download(release: str, folder: str, python_version: str) -> str:
    """pip-download the release's macOS arm64 wheel into `folder`; returns its path."""
    for platform in PLATFORMS:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--platform", platform, "--python-version", python_version, f"torch=={release}", "-d", folder]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
            if wheels:
                return os.path.join(folder, wheels[0])
    raise SystemExit(f"build_kb: no macOS arm64 wheel of torch {release} for Python {python_version} "
                     "— try another --python-version, or pass --wheel")


def sha256_file(path: str) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plan(args: argparse.Namespace, kb_dir: str) -> EntryPlan:
    """Read the files (installed, given wheel or downloaded) and plan the entry."""
    store = load_store(kb_dir)
    if args.installed:
        old = store.line(args.release)
        return plan_entry(args.release, read_installed(), store,
                          old.wheel if old else "-", old.wheel_sha256 if old else "-")
    if args.wheel:
        return plan_entry(args.release, read_wheel(args.wheel), store,
                          os.path.basename(args.wheel), sha256_file(args.wheel))
    with tempfile.TemporaryDirectory(prefix="opscan-kb-") as tmp:
        wheel = download(args.release, tmp, args.python_version)
        return plan_entry(args.release, read_wheel(wheel), store, os.path.basename(wheel), sha256_file(wheel))


def check(result: EntryPlan, kb_dir: str) -> int:
    """Compare a plan with the shipped files; 0 when equal."""
    path = os.path.join(kb_dir, result.entry_name)
    if result.entry_text is not None:
        with open(path, encoding="utf-8") as fh:
            if fh.read() != result.entry_text:
                print(f"build_kb: {path} differs from the rebuilt entry", file=sys.stderr)
                return 1
    line = load_store(kb_dir).line(result.index_line.release)
    if line is None or (line.entry, line.yaml_sha) != (result.index_line.entry, result.index_line.yaml_sha):
        print(f"build_kb: index.txt line of {result.index_line.release} differs", file=sys.stderr)
        return 1
    print(f"build_kb: {result.entry_name} matches the rebuilt entry of torch {result.index_line.release}")
    return 0


def write(result: EntryPlan, kb_dir: str) -> None:
    """Write the entry file and the index line."""
    if result.entry_text is not None:
        with open(os.path.join(kb_dir, result.entry_name), "w", encoding="utf-8") as fh:
            fh.write(result.entry_text)
    store = load_store(kb_dir)
    lines = [line for line in store.index if line.release != result.index_line.release]
    with open(os.path.join(kb_dir, "index.txt"), "w", encoding="utf-8") as fh:
        fh.write(format_index([*lines, result.index_line]))
    shared = "" if result.entry_text is not None else " (records equal: shares that entry)"
    print(f"build_kb: torch {result.index_line.release} -> {result.entry_name}{shared}")


def main(argv: list[str] | None = None) -> int:
    """Build (or --check) one release's entry."""
    p = argparse.ArgumentParser(prog="build_kb.py", description=__doc__.split("\n\n")[0])
    p.add_argument("release", help="torch release, e.g. 2.14.1")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--wheel", help="a torch wheel already downloaded")
    src.add_argument("--installed", action="store_true", help="read the installed torch's files (no network)")
    p.add_argument("--python-version", default="3.11", help="wheel tag to download (default 3.11)")
    p.add_argument("--kb-dir", default=RELEASES_DIR, help="the releases folder (default: the package's)")
    p.add_argument("--check", action="store_true", help="compare with the shipped entry instead of writing")
    args = p.parse_args(argv)
    Release.parse(args.release)  # ValueError on a malformed release
    kb_dir = os.path.abspath(args.kb_dir)
    result = plan(args, kb_dir)
    return check(result, kb_dir) if args.check else write(result, kb_dir) or 0


if __name__ == "__main__":
    sys.exit(main())
