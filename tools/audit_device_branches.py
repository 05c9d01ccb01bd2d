#!/usr/bin/env python3
"""Find every device-type test in torch's Python code and in transformers and timm, and write the table.

    python tools/audit_device_branches.py                      # write docs/device_branches.md
    python tools/audit_device_branches.py --check              # exit 1 if the table is stale or a hit is unreviewed
    python tools/audit_device_branches.py --torch-wheel W.whl  # torch 2.13.0's files from a wheel you have

What counts as a hit (read with `ast`, nothing imported or run): a comparison that involves a
device-type string ("cpu", "cuda", "mps", ..., also with an index: "mps:0") or a `.device.type` /
`device_type` operand; an `is_cuda` / `is_cpu` / `is_mps` / `is_xpu` / `is_meta` attribute; a call of a
`..._supported_devices`, `_device_has_...`, `_has_foreach_support`, `is_available` helper; a list/tuple/set of
two or more device names. One row per source line.

Where: torch 2.14.1 (installed) and torch 2.13.0 (`pip download torch==2.13.0 --no-deps`, the CPU wheel, read
as a zip) — torch/nn (functional.py, modules, utils, attention, parallel), torch/optim and the foreach helpers
(torch/utils/_foreach_utils.py), torch/_refs, torch/_decomp, torch/functional.py (torch.norm, ...),
torch/_tensor.py (the Tensor methods written in Python), torch/amp, torch/cuda/amp and torch/cpu/amp (autocast,
GradScaler), torch/autograd/__init__.py and torch/utils/checkpoint.py — and the installed transformers and timm (all
of their Python files). A torch row carries its line in both releases (matched by file, enclosing function and
statement text).

Each hit is classified, first match wins: a reviewed entry in tools/device_branch_review.yaml (a human's
verdict with its reason and, for a relevant branch, the opscan rule that handles it), else an automatic rule
whose reason is printed with the row (a test that names only devices other than cpu and mps, or both cpu
and mps, sends the CPU trace and MPS down the same branch). A hit neither covers is "unreviewed": --check
fails until someone reviews it.

Exit codes: 0 written (with --check: up to date, nothing unreviewed), 1 --check found a stale table or an
unreviewed hit, 2 usage or download error.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "device_branches.md"
REVIEW = ROOT / "tools" / "device_branch_review.yaml"
OLD_TORCH = "2.13.0"
TORCH_PATHS = ("torch/nn/", "torch/optim/", "torch/_refs/", "torch/_decomp/", "torch/utils/_foreach_utils.py",
               "torch/functional.py", "torch/_tensor.py", "torch/amp/", "torch/cuda/amp/", "torch/cpu/amp/",
               "torch/autograd/__init__.py", "torch/utils/checkpoint.py")
OTHER_DEVICES = {"cuda", "xpu", "hpu", "mtia", "npu", "xla", "lazy", "privateuseone", "ipu", "maia", "tpu",
                 "neuron", "disk", "ve", "vulkan", "fpga"}
DEVICES = OTHER_DEVICES | {"cpu", "mps", "meta"}
ATTRS = {"is_cuda", "is_mps", "is_cpu", "is_xpu", "is_hpu", "is_mtia", "is_meta"}
HELPER = re.compile(r"(supported_devices|has_foreach_support|has_fused_support|_device_has_|is_available)$")
DEVICE_OPERAND = re.compile(r"device\.type|device_type|\.type\b")


@dataclass
class Hit:
    """One source line that tests a device type."""

    library: str
    file: str
    line: int
    function: str
    text: str
    kinds: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    helpers: set[str] = field(default_factory=set)
    lines: dict[str, int | None] = field(default_factory=dict)  # torch: release -> line


class Scanner(ast.NodeVisitor):
    """Collects the hits of one file, with the qualified name of the function around each."""

    def __init__(self, library: str, file: str, source: str):
        self.library, self.file, self.lines = library, file, source.splitlines()
        self.scope: list[str] = []
        self.hits: dict[int, Hit] = {}

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _add(self, node, kind: str, devices=(), helper: str | None = None) -> None:
        hit = self.hits.get(node.lineno)
        if hit is None:
            hit = self.hits[node.lineno] = Hit(self.library, self.file, node.lineno, ".".join(self.scope) or "<module>",
                                               self.lines[node.lineno - 1].strip())
        hit.kinds.add(kind)
        hit.devices.update(devices)
        if helper:
            hit.helpers.add(helper)

    def visit_Compare(self, node):
        names = _device_strings(node)
        text = ast.unparse(node)
        if names or ("device" in text and DEVICE_OPERAND.search(text)):
            self._add(node, "compare", names)
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if node.attr in ATTRS:
            self._add(node, "attr", {node.attr.removeprefix("is_")})
        self.generic_visit(node)

    def visit_Call(self, node):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if HELPER.search(name or ""):
            self._add(node, "helper", helper=ast.unparse(node.func))
        self.generic_visit(node)

    def _collection(self, node):
        names = _device_strings(node)
        if len(names) >= 2:
            self._add(node, "list", names)
        self.generic_visit(node)

    visit_List = visit_Tuple = visit_Set = _collection


def _device_strings(node) -> set[str]:
    """The device types a node names: "mps", and with an index ("mps:0", as GradScaler.unscale_ compares)."""
    return {n.value.split(":")[0] for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (n.value in DEVICES or re.fullmatch(r"[a-z_]+:\d+", n.value) and n.value.split(":")[0] in DEVICES)}


def scan_source(library: str, file: str, source: str) -> list[Hit]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    scanner = Scanner(library, file, source)
    scanner.visit(tree)
    return sorted(scanner.hits.values(), key=lambda h: h.line)


def installed_files(package: str, prefixes=None):
    """(path relative to site-packages, text) of an installed package's .py files under `prefixes`."""
    import importlib.util

    base = Path(importlib.util.find_spec(package).origin).parent.parent
    for path in sorted((base / package).rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if prefixes is None or rel.startswith(prefixes):
            yield rel, path.read_text(encoding="utf-8", errors="replace")


def wheel_files(wheel: str, prefixes):
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if name.endswith(".py") and name.startswith(prefixes):
                yield name, archive.read(name).decode("utf-8", errors="replace")


def scan(library: str, files) -> list[Hit]:
    return [hit for file, text in files for hit in scan_source(library, file, text)]


def merge_torch(new: list[Hit], old: list[Hit], new_release: str) -> list[Hit]:
    """One row per hit of either release, with its line in each (matched by file, function, text, order)."""
    def keyed(hits):
        seen: Counter = Counter()
        out = {}
        for h in hits:
            key = (h.file, h.function, h.text)
            out[(*key, seen[key])] = h
            seen[key] += 1
        return out

    newer, older = keyed(new), keyed(old)
    rows = []
    for key in sorted(set(newer) | set(older), key=lambda k: (k[0], (newer.get(k) or older[k]).line)):
        hit = newer.get(key) or older[key]
        hit.lines = {new_release: newer[key].line if key in newer else None,
                     OLD_TORCH: older[key].line if key in older else None}
        rows.append(hit)
    return rows


@dataclass(frozen=True)
class Verdict:
    relevant: bool | None  # None: unreviewed
    reason: str
    rule: str = ""
    by: str = "auto"


def load_review() -> list[dict]:
    return yaml.safe_load(REVIEW.read_text(encoding="utf-8"))["reviews"]


def classify(hit: Hit, reviews: list[dict]) -> Verdict:
    for review in reviews:
        if _matches(review, hit):
            return Verdict(review["relevant"], review["reason"], review.get("rule", ""), "review")
    return _automatic(hit)


def _matches(review: dict, hit: Hit) -> bool:
    return (review.get("library", hit.library) == hit.library
            and fnmatch.fnmatch(hit.file, review["file"])
            and fnmatch.fnmatch(hit.function, review.get("function", "*"))
            and review.get("contains", "") in hit.text)


def _automatic(hit: Hit) -> Verdict:
    if hit.helpers and not hit.devices:
        return Verdict(None, "helper call: review what it answers for cpu and mps")
    names = hit.devices - {"meta"}
    if "meta" in hit.devices and not names:
        return Verdict(False, "tests for meta tensors only (initialisation, loading): the CPU trace and MPS take "
                              "the same branch")
    if names and names <= OTHER_DEVICES:
        return Verdict(False, f"names only {', '.join(sorted(names))}: neither the CPU trace nor MPS matches, so "
                              "both take the same branch")
    if {"cpu", "mps"} <= names and not hit.helpers:
        return Verdict(False, "names cpu and mps together: the CPU trace and MPS take the same branch")
    return Verdict(None, "unreviewed")


def _where(hit: Hit, releases: tuple[str, ...]) -> list[str]:
    if hit.library != "torch":
        return [f"{hit.line}"]
    return [f"{hit.lines[r]}" if hit.lines.get(r) else "—" for r in releases]


def render(sections, versions: dict[str, str], releases: tuple[str, ...]) -> str:
    out = [HEADER.format(**versions, command=COMMAND)]
    totals = Counter()
    for library, rows in sections:
        relevant = [(h, v) for h, v in rows if v.relevant]
        totals.update({"hits": len(rows), "relevant": len(relevant)})
        lines = "line " + " · ".join(releases) if library == "torch" else "line"
        title = f"{library} {' · '.join(releases)}" if library == "torch" else f"{library} {versions[library]}"
        out.append(f"\n## {title}: {len(rows)} hits, {len(relevant)} relevant\n")
        out.append(f"| file | function | {lines} | test | relevant | reason · handled by |")
        out.append("|---|---|---|---|---|---|")
        for hit, verdict in rows:
            mark = {True: "**yes**", False: "no", None: "**unreviewed**"}[verdict.relevant]
            reason = verdict.reason + (f" · rule `{verdict.rule}`" if verdict.rule else "")
            out.append(f"| {hit.file} | {hit.function} | {' · '.join(_where(hit, releases))} | "
                       f"`{_cell(hit.text)}` | {mark} | {_cell(reason)} |")
    out.insert(1, f"\n{totals['hits']} hits, {totals['relevant']} relevant.\n")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")[:160]


COMMAND = "python tools/audit_device_branches.py"
HEADER = """# Device branches in torch, transformers and timm

Generated by `{command}` (read with `ast`; see its docstring) from torch {torch} (installed) and {old}
(the CPU wheel), transformers {transformers} and timm {timm}; reviews in `tools/device_branch_review.yaml`.
A branch is **relevant** when the CPU trace and MPS take different sides of it in code a training or
inference step runs; each relevant one names the opscan rule that handles it ([The MPS view](mps-view.md)).
[README](../README.md) · [all docs](../README.md#documentation)."""


def download_old(folder: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"torch=={OLD_TORCH}", "-d", folder]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        raise SystemExit(f"audit: pip download torch=={OLD_TORCH} failed — pass --torch-wheel")
    return os.path.join(folder, next(f for f in os.listdir(folder) if f.endswith(".whl")))


def build(wheel: str) -> tuple[str, int]:
    import torch

    release = torch.__version__.split("+")[0]
    versions = {"torch": release, "old": OLD_TORCH, "transformers": importlib.metadata.version("transformers"),
                "timm": importlib.metadata.version("timm")}
    reviews = load_review()
    torch_rows = merge_torch(scan("torch", installed_files("torch", TORCH_PATHS)),
                             scan("torch", wheel_files(wheel, TORCH_PATHS)), release)
    sections = [(lib, [(h, classify(h, reviews)) for h in hits]) for lib, hits in (
        ("torch", torch_rows), ("transformers", scan("transformers", installed_files("transformers"))),
        ("timm", scan("timm", installed_files("timm"))))]
    unreviewed = [h for _, rows in sections for h, v in rows if v.relevant is None]
    for review in reviews:
        if not any(_matches(review, h) for _, rows in sections for h, _ in rows):
            print(f"review matches no hit: {review['file']} {review.get('function', '')}", file=sys.stderr)
    for hit in unreviewed:
        print(f"unreviewed: {hit.library} {hit.file}:{hit.line} ({hit.function}): {hit.text}", file=sys.stderr)
    return render(sections, versions, (release, OLD_TORCH)), len(unreviewed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-wheel", help=f"torch {OLD_TORCH}'s wheel (default: pip download it)")
    parser.add_argument("--check", action="store_true", help="compare with docs/device_branches.md, write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text, unreviewed = build(args.torch_wheel or download_old(tmp))
    if args.check:
        stale = not DOC.exists() or DOC.read_text(encoding="utf-8") != text
        print("audit: " + ("stale table" if stale else "table up to date") + f", {unreviewed} unreviewed",
              file=sys.stderr)
        return 1 if stale or unreviewed else 0
    DOC.write_text(text, encoding="utf-8")
    print(f"audit: wrote {DOC.relative_to(ROOT)} ({unreviewed} unreviewed)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
