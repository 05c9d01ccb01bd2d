"""Layering, parsed with ast (nothing run). Every import counts: top-level, inside functions, and relative ones.

1. Stage order: a module imports only its own stage, the shared spine, and earlier stages, in the order of
   `STAGES` (target → trace → mps_view → knowledge → predict → probe → graph → report → memory → render → repro
   → accept → scan → zoo → bundle → api → cli; api: the Python API, which composes the scan and the renderers).
2. No import cycles between modules.
3. Only modules of opscan/cli (and __main__) import opscan.cli.
4. The top level of opscan/ holds at most ten modules: the pipeline's spine; everything else sits in its stage.
5. report, render/*, the MPS view, the knowledge base, opkey, verdict, errors, target/inputs.py and the CLI's
   dispatcher never import torch at module level (so `opscan --help` and the renderers stay light).
6. No module-level mutable run state: no module-level name is written after import (mutated, item-assigned,
   rebound through `global`) from any module, outside a short list of a process's own caches and registrations
   (PROCESS_STATE, each with its reason); a run's state is its RunContext's (opscan/target/run.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parent.parent / "opscan"
SHARED = ("opscan", "opscan.errors", "opscan.opkey", "opscan.verdict", "opscan.markers", "opscan.units",
          "opscan.trust", "opscan.trust.read", "opscan.trust.names", "opscan.trust.text", "opscan.trust.output")
STAGES = ("target", "trace", "mps_view", "knowledge", "predict", "probe", "graph", "report", "memory", "render",
          "repro", "accept", "scan", "zoo", "bundle", "api", "cli")
LOOSE_BUDGET = 10


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imported(path: Path, top_level_only: bool = False) -> set[str]:
    """Every module name `path` imports (opscan's and third-party), relative imports resolved."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package, top_level_only)


def imports_in(source: str, package: str, top_level_only: bool = False) -> set[str]:
    """The module names `source` (a module of `package`) imports."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return found


def owning_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def stage_of(module: str) -> str | None:
    """The stage a module belongs to (None: the shared spine or __main__)."""
    if module in SHARED or module == "opscan.__main__":
        return None
    return module.split(".")[1]


def test_every_module_has_a_stage():
    assert {stage_of(m) for m in MODULES} - {None} <= set(STAGES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_earlier_stages(module):
    own = stage_of(module)
    if own is None and module != "opscan.__main__":
        later = [m for m in imported(MODULES[module]) if owning_module(m) and stage_of(owning_module(m))]
        assert later == [], f"the shared spine imports a stage: {later}"
        return
    rank = STAGES.index(own) if own else len(STAGES)
    bad = sorted(m for m in imported(MODULES[module])
                 if owning_module(m) and stage_of(owning_module(m)) and STAGES.index(stage_of(owning_module(m))) > rank)
    assert bad == [], f"{module} ({own}) imports later stages"


def test_no_import_cycles():
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        graph.add_edges_from((module, owner) for m in imported(path) if (owner := owning_module(m)) not in
                             (None, module) and owner != "opscan")
    assert [c for c in nx.strongly_connected_components(graph) if len(c) > 1] == []


def test_only_the_cli_layer_imports_the_cli():
    importers = sorted(m for m, p in MODULES.items() if stage_of(m) != "cli" and m != "opscan.__main__"
                       and any(owning_module(i) and owning_module(i).startswith("opscan.cli") for i in imported(p)))
    assert importers == []


def test_the_top_level_holds_only_the_spine():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= LOOSE_BUDGET, loose


TORCH_FREE = ["opscan.report", "opscan.mps_view", "opscan.opkey", "opscan.verdict", "opscan.errors",
              "opscan.markers", "opscan.units", "opscan.target.inputs", "opscan.target.run", "opscan.cli",
              "opscan.cli.common", "opscan.cli.command",
              *(m for m in MODULES if m.startswith(("opscan.render", "opscan.knowledge", "opscan.api")))]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_does_not_import_torch_at_import_time(module):
    top = imported(MODULES[module], top_level_only=True)
    assert not any(m == "torch" or m.startswith("torch.") for m in top)


def test_the_resolver_sees_lazy_and_relative_imports():
    # a guard for the guard: imports inside functions and relative ones are both found
    assert "opscan.predict.calls" in imported(MODULES["opscan.scan"])  # imported inside scan()
    source = "import os\n\ndef f():\n    from .lanes import decide_lane\n    from ..report import Report\n"
    assert imports_in(source, "opscan.graph") >= {"os", "opscan.graph.lanes", "opscan.report"}
    assert imports_in(source, "opscan.graph", top_level_only=True) == {"os"}
    assert STAGES.index(stage_of("opscan.report")) > STAGES.index(stage_of("opscan.graph.lanes"))


# --- 6. no module-level mutable run state: a run's state is its RunContext's (opscan/target/run.py) ---------------

MUTATORS = {"append", "extend", "insert", "pop", "popleft", "popitem", "remove", "clear", "update", "setdefault",
            "add", "discard", "appendleft", "sort", "reverse"}
# module-level containers written after import that are not a run's state, each with its reason
PROCESS_STATE = {
    "opscan.memory.tracker._MUTABLE": "cache keyed by the operator (immutable): whether its schema mutates",
    "opscan.trace.call_cache._cacheable_ops": "cache keyed by the operator: whether FakeTensorMode caches it",
    "opscan.trace.plans.PLANS": "cache keyed by the operator (its id, checked by identity): what the recorder needs "
                                "of it (OpKey, bookkeeping, Tensor parameters, whether it writes into an argument)",
    "opscan.trace.argspec._NAMED": "cache keyed by a dtype, device, layout or memory format: its display and spec forms",
    "opscan.trace.frames._KINDS": "cache keyed by the code object (immutable): its kind, torch unit or place",
    "opscan.trace.tensors._DTYPES": "cache keyed by torch.dtype: its name and element size",
    "opscan.trace.tensors._DEVICE_NAMES": "cache keyed by torch.device: its name",
    "opscan.trace.collector._depth": "nesting of gc.freeze blocks: mirrors the collector's own process-wide state",
    "opscan.trace.hooks._ACTIVE": "the lenses entered: torch's dispatcher registration is process-wide, one per process",
    "opscan.trace.hooks._LIBRARY": "the torch.library.Library registered while a lens is active (process-wide)",
    "opscan.trace.device_calls._IMPORTED": "cache keyed by a module file: the device calls its module-level code made "
                                           "when imported, which runs once per process (target/once.py)",
}


def module_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level by assignment."""
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def owners_of_names(module: str, tree: ast.Module) -> dict[str, str]:
    """name -> 'module.name' for the module's own top-level names and the names it imports from opscan modules."""
    owners = {name: f"{module}.{name}" for name in module_level_names(tree)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opscan") and not node.level:
            owners.update({(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names})
    return owners


def written_names(tree: ast.Module, owners: dict[str, str]) -> set[str]:
    """The owners of module-level names written after import: mutating calls, item or slice assignment,
    augmented assignment, deletion of items, and `global` statements."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(owners.get(name, name) for name in node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.attr in MUTATORS:
            found.add(owners.get(node.func.value.id, ""))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if not isinstance(node, ast.AugAssign) else [node.target]
            found.update(owners.get(t.value.id, "") for t in targets
                         if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name))
    return found - {""}


def module_state(modules: dict[str, Path]) -> dict[str, str]:
    """'module.name' -> the module that writes it, for every module-level name of `modules` written after import
    (in a function or class body: top-level statements fill registries at import time)."""
    trees = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in modules.items()}
    top = {f"{module}.{name}" for module, tree in trees.items() for name in module_level_names(tree)}
    state: dict[str, str] = {}
    for module, tree in trees.items():
        after_import = ast.Module(body=[n for n in tree.body if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], type_ignores=[])
        for owner in written_names(after_import, owners_of_names(module, tree)) & top:
            state.setdefault(owner, module)
    return state


def test_no_module_level_mutable_run_state():
    """A run's state (its stages of user code, the folders it made, the real stdout, ...) is passed down in the one
    RunContext; what a module may keep after import is only a process's own (PROCESS_STATE, each with its reason)."""
    found = module_state(MODULES)
    assert sorted(set(found) - set(PROCESS_STATE)) == [], found
    assert sorted(set(PROCESS_STATE) - set(found)) == [], "allowed exceptions that no longer exist: drop them"


def test_the_state_check_sees_writes_from_other_modules_and_globals():
    # a guard for the guard: a list filled from another module, a global rebound, a dict item set
    tree = ast.parse("from opscan.cli.files import CREATED\nX = {}\nN = 0\n\ndef f():\n    global N\n"
                     "    N += 1\n    CREATED.append(1)\n    X['a'] = 1\n")
    owners = owners_of_names("opscan.fake", tree)
    assert written_names(tree, owners) == {"opscan.cli.files.CREATED", "opscan.fake.X",
                                                            "opscan.fake.N"}


# --- one name per thing -------------------------------------------------------------------------------------------

# public names that several modules define on purpose, each with why; everything else is defined in one module only
SHARED_NAMES = {
    "main": "the entry point of a process (python -m, a spawned worker or zygote, a bundle's runner) or a subcommand",
    "VERSION": "each module's own on-disk or wire format version (bundle results, kb build, journals, protocol, argspec)",
    "build_parser": "each cli subcommand's own argparse parser (the CLI's one-command-base work may fold them)",
    "EPILOG": "each cli subcommand's own --help epilog",
    "log": "a module's stderr logger (cli subcommands, memory/batch.py, trace/fake.py): logs go to stderr only",
    "check_device": "probe, bundle and accept each refuse an unusable device naming their own flags "
                    "(accept/engine.py says why)",
    "environment": "report/assemble.py's report record and accept/provenance.py's: two records of different schemas",
    "prepare": "scan.py prepares a scan, accept/run.py a device run",
    "Comparison": "probe/protocol.py's record of one probe pass; accept/compare.py's of two training runs",
    "DTYPES": "target/inputs.py: --input dtypes; accept/spec.py and zoo/models.py: dtypes a spec may cast a model to",
    "STYLE": "render/console.py's rich styles per verdict and render/html_assets.py's CSS",
    "header": "bundle/remote.py's results header and zoo/journal.py's journal header",
    "run": "cli/dispatch.py runs a command line, bundle/remote.py a bundle",
    "render_html": "render/html.py renders a report, zoo/html.py a leaderboard",
    "render_json": "render/structured.py renders a report, zoo/outputs.py a leaderboard",
    "diff": "predict/coverage.py diffs two releases' coverage, zoo/outputs.py two leaderboards (used qualified)",
    "select": "predict/coverage.py filters coverage rows (used qualified: cov.select), cli/repro.py picks findings",
    "render": "predict/coverage.py renders coverage (used qualified: cov.render), cli/common.py a report",
}
# modules whose names live in another namespace: repro/runtime.py is the body of every generated repro script,
# standalone (it may not import opscan), so its functions are the script's own
OWN_NAMESPACE = {"opscan.repro.runtime"}


def public_definitions(path: Path) -> set[str]:
    """The public (non-underscore) functions, classes and constants a module defines at its top level."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_no_public_name_is_defined_in_two_modules():
    where: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if module not in OWN_NAMESPACE:
            for name in public_definitions(path):
                where.setdefault(name, []).append(module)
    twice = {name: modules for name, modules in sorted(where.items()) if len(modules) > 1 and name not in SHARED_NAMES}
    assert twice == {}, "one name per thing: rename, share one definition, or say why in SHARED_NAMES"


def test_the_name_check_sees_functions_classes_and_constants(tmp_path):
    # a guard for the guard
    source = tmp_path / "m.py"
    source.write_text("import os\nA = 1\nB: int = 2\n_c = 3\n\ndef f():\n    D = 4\n\nclass K:\n    E = 5\n")
    assert public_definitions(source) == {"A", "B", "f", "K"}
