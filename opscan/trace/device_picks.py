"""Trace stage: what a `torch.cuda.is_available()` call in the user's code decides, read from its source.

On a Mac `torch.cuda.is_available()` is False (and `torch.cuda.device_count()` 0), so the code the query guards
does not run there. Which code that is, is read from the statement around the call (ast, the running instruction's
position from `co_positions`, Python 3.11+):
- `"cuda" if torch.cuda.is_available() else "cpu"`, `torch.device(...)` of it, or `if torch.cuda.is_available():`
  whose branch names CUDA (`"cuda"`, `.cuda()`) and whose other side names no MPS (an `elif` asking
  `torch.backends.mps.is_available()`, a `"mps"`): PICK_CPU — on a Mac the step takes the other side, the CPU;
- the same with an MPS side: PICK_MPS — portable, nothing to report;
- anything else (`use_amp = torch.cuda.is_available()`, a guard around `torch.cuda.synchronize()`): QUERY — on a
  Mac it answers False and what it guards does not run;
- source that cannot be read (a notebook cell, generated code): QUERY.
"""

from __future__ import annotations

import ast
import functools
import linecache

PICK_CPU, PICK_MPS, QUERY = "pick-cpu", "pick-mps", "query"


def pick_of(frame) -> str:
    """PICK_CPU, PICK_MPS or QUERY for the torch.cuda query being called from `frame` (see the module docstring)."""
    try:
        position = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    except (AttributeError, IndexError):
        return QUERY
    tree = _parsed(frame.f_code.co_filename, "".join(linecache.getlines(frame.f_code.co_filename)))
    if tree is None or None in position:
        return QUERY
    chain = _chain_to(tree, position)
    for node, child in zip(reversed(chain[:-1]), reversed(chain[1:])):
        if isinstance(node, (ast.IfExp, ast.If)) and child is node.test:
            return _branches(node)
    return QUERY


@functools.lru_cache(maxsize=64)
def _parsed(filename: str, source: str) -> ast.Module | None:
    try:
        return ast.parse(source, filename) if source else None
    except (SyntaxError, ValueError):
        return None


def _chain_to(tree: ast.AST, position) -> list[ast.AST]:
    """The nodes from `tree` down to the innermost one spanning the call at `position` (line, end, col, end col)."""
    line, end, col, end_col = position
    chain = [tree]
    while True:
        inner = next((c for c in ast.iter_child_nodes(chain[-1]) if _spans(c, line, end, col, end_col)), None)
        if inner is None:
            return chain
        chain.append(inner)


def _spans(node: ast.AST, line: int, end: int, col: int, end_col: int) -> bool:
    if not hasattr(node, "lineno") or node.end_lineno is None:
        return False
    starts = (node.lineno, node.col_offset) <= (line, col)
    ends = (node.end_lineno, node.end_col_offset) >= (end, end_col)
    return starts and ends


def _branches(node: ast.IfExp | ast.If) -> str:
    """PICK_CPU / PICK_MPS / QUERY for a conditional on the CUDA query (its true side runs only with CUDA)."""
    cuda_side = node.body if isinstance(node.body, list) else [node.body]
    other = node.orelse if isinstance(node.orelse, list) else [node.orelse]
    if not any(_names_cuda(part) for part in cuda_side):
        return QUERY
    return PICK_MPS if any(_names_mps(part) for part in other) else PICK_CPU


def _names_cuda(node: ast.AST) -> bool:
    """Does `node` pick CUDA: a "cuda" string literal ("cuda:0") or a `.cuda()` call (not `torch.cuda.x()`)?"""
    for sub in ast.walk(node):
        if _literal(sub, "cuda"):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "cuda":
            return True
    return False


def _names_mps(node: ast.AST) -> bool:
    """Does `node` name MPS: an "mps" string literal or anything under `mps` (`torch.backends.mps.is_available()`)?"""
    return any(_literal(sub, "mps") or (isinstance(sub, ast.Attribute) and sub.attr == "mps") for sub in ast.walk(node))


def _literal(node: ast.AST, device: str) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == device
