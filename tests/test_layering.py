"""Layering: stages hand data forward and never import a later stage (parsed with ast, nothing run).

- report.py, render/*, classify.py, mps_view.py and knowledge/* never import torch at module level;
- the trace stage never imports mps_view, knowledge, classify, predict, report or render;
- nothing imports cli.py (only __main__ does);
- cli.py imports torch nowhere at module level (so `opscan --help` stays light).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "opscan"


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _modules(*globs: str) -> list[Path]:
    return sorted(p for g in globs for p in PKG.glob(g))


TORCH_FREE = _modules("report.py", "render/*.py", "classify.py", "mps_view.py", "knowledge/*.py", "opkey.py",
                      "verdict.py", "errors.py", "inputs.py", "cli.py")


@pytest.mark.parametrize("path", TORCH_FREE, ids=lambda p: str(p.relative_to(PKG)))
def test_module_does_not_import_torch_at_import_time(path):
    assert not any(m == "torch" or m.startswith("torch.") for m in _imports(path, top_level_only=True))


LATER_THAN_TRACE = ("opscan.mps_view", "opscan.knowledge", "opscan.classify", "opscan.predict", "opscan.report",
                    "opscan.render", "opscan.scan", "opscan.cli")


@pytest.mark.parametrize("path", _modules("trace/*.py", "target.py"), ids=lambda p: str(p.relative_to(PKG)))
def test_trace_stage_never_imports_a_later_stage(path):
    later = {m for m in _imports(path, top_level_only=False) if m.startswith(LATER_THAN_TRACE)}
    assert later == set()


@pytest.mark.parametrize("path", _modules("report.py", "render/*.py"), ids=lambda p: str(p.relative_to(PKG)))
def test_report_and_renderers_never_import_the_pipeline(path):
    pipeline = ("opscan.trace", "opscan.target", "opscan.scan", "opscan.predict", "opscan.cli")
    assert {m for m in _imports(path, top_level_only=False) if m.startswith(pipeline)} == set()


def test_nothing_imports_cli():
    # only command-line modules (cli.py of a package, coverage_cli.py, __main__.py) share the CLI's helpers
    is_cli = lambda p: p.name in ("cli.py", "__main__.py") or p.name.endswith("_cli.py")  # noqa: E731
    importers = [p for p in PKG.rglob("*.py")
                 if not is_cli(p) and "opscan.cli" in _imports(p, top_level_only=False)]
    assert importers == []
