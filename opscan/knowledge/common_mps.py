"""Knowledge stage: PyTorch's own MPS test expectations, read from the wheel's `common_mps.py`.

`torch/testing/_internal/common_mps.py` (in wheels from 2.8.0 on) keeps its lists as local
variables of functions defined only when MPS is available, so importing it on Linux yields nothing.
This module parses it with `ast` and never imports it (nor torch): every dict or set literal
assigned to an upper-case name inside a function is collected (mps_facts.md §3).

Keys are OpInfo names (`op.name + op.variant_test_name`, e.g. "nn.functional.conv2d",
"divno_rounding_mode"), not aten overloads. Until the full OpInfo -> aten mapping exists, an aten
op is matched to OpInfo names *by name only* (see `opinfo_candidates`); callers must say so.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

RELATIVE_PATH = os.path.join("testing", "_internal", "common_mps.py")
# Ops that common_mps.py adds to SUPPORTED_COMPLEX_OPS only on macOS >= 14 (2.8.0); every torch
# release that ships this file supports complex on MPS only from macOS 14 on (mps_facts.md §4.2).
_COMPLEX_LISTS = ("SUPPORTED_COMPLEX_OPS", "AFTER_MACOS_14_0_SUPPORTED_COMPLEX_OPS")
# OpInfo name prefixes whose aten spelling joins with "_" instead of ".": linalg_svd -> linalg.svd.
_DOTTED = ("linalg", "special", "fft", "sparse")


@dataclass(frozen=True, eq=False)
class CommonMps:
    """The lists of one common_mps.py: complex-supported OpInfo names and unimplemented dtypes."""

    path: str
    supported_complex: frozenset[str]
    unimplemented: Mapping[str, tuple[str, ...] | None] = field(repr=False)  # None = all dtypes

    def complex_match(self, aten_name: str) -> str | None:
        """The SUPPORTED_COMPLEX_OPS name that `aten_name` matches by name, or None."""
        return next((c for c in opinfo_candidates(aten_name) if c in self.supported_complex), None)


def opinfo_candidates(aten_name: str) -> tuple[str, ...]:
    """OpInfo names an aten op name may correspond to, matched by spelling only.

    The name itself; without one trailing "_" (in-place variant: "add_" -> "add", dunders kept);
    without one leading "_" ("_conj" -> "conj"); "nn.functional.<name>"; and for linalg_/special_/
    fft_/sparse_ names the dotted form ("linalg_svd" -> "linalg.svd"). Variant OpInfos
    ("divno_rounding_mode") never match: that needs the OpInfo -> aten mapping."""
    base = aten_name
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    names = [base]
    if base.startswith("_") and not base.startswith("__"):
        names.append(base[1:])
    for name in list(names):
        names.append(f"nn.functional.{name}")
        prefix, sep, rest = name.partition("_")
        if sep and prefix in _DOTTED:
            names.append(f"{prefix}.{rest}")
    return tuple(dict.fromkeys(names))


def installed_path() -> str | None:
    """common_mps.py of the installed torch, located without importing torch (None if absent)."""
    spec = importlib.util.find_spec("torch")
    for root in (spec and spec.submodule_search_locations) or ():
        candidate = os.path.join(root, RELATIVE_PATH)
        if os.path.isfile(candidate):
            return candidate
    return None


def _dtype_names(node: ast.expr) -> tuple[str, ...] | None:
    """`None` -> None (all dtypes); `[torch.int64, ...]` -> ("int64", ...)."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return tuple(e.attr for e in node.elts if isinstance(e, ast.Attribute))
    raise ValueError(f"unexpected dtype list {ast.unparse(node)!r}")


def _literals(tree: ast.AST) -> dict[str, ast.expr]:
    """Upper-case names assigned a dict or set literal inside any function."""
    found: dict[str, ast.expr] = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(func):
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            named = isinstance(target, ast.Name) and target.id.isupper()
            if named and isinstance(value, (ast.Dict, ast.Set)):
                found.setdefault(target.id, value)
    return found


def _strings(node: ast.expr) -> list[str]:
    """The string keys of a dict literal or the elements of a set literal."""
    items = node.keys if isinstance(node, ast.Dict) else node.elts
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


@functools.lru_cache(maxsize=4)
def load_common_mps(path: str) -> CommonMps:
    """Parse common_mps.py at `path` (cached; never imported)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    lists = _literals(tree)
    if "SUPPORTED_COMPLEX_OPS" not in lists or "UNIMPLEMENTED_XFAILLIST" not in lists:
        raise ValueError(f"{path}: SUPPORTED_COMPLEX_OPS or UNIMPLEMENTED_XFAILLIST not found")
    complex_ops = frozenset(s for name in _COMPLEX_LISTS if name in lists for s in _strings(lists[name]))
    table = lists["UNIMPLEMENTED_XFAILLIST"]
    unimplemented = {
        k.value: _dtype_names(v) for k, v in zip(table.keys, table.values) if isinstance(k, ast.Constant)
    }
    return CommonMps(path, complex_ops, MappingProxyType(unimplemented))
