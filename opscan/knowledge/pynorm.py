"""Knowledge stage: the normalized body of each function of a torch Python file, and its hash.

A *unit* is a module-level function or a method of a (nested) class, named as its code object's `co_qualname`
("f", "Class.method", "Outer.Inner.method"); nested functions, lambdas and comprehensions belong to the unit they
are written in (a frame's unit is its qualname up to ".<locals>"). Assignments of simple names at module or class
level are units too (`Class.<assign>__pow__`): a binding can move between Python and C.

`unit_hashes(source)` -> {unit: hash}. Two releases' versions of a unit get the same hash when their ASTs are
equal after this normalization (what tools/build_py_drift.py writes into py_drift.txt and the trace compares):
- docstrings, comments and type annotations go (argument and return annotations, `x: T = v` -> `x = v`, a bare
  `x: T`), with `if TYPE_CHECKING:` bodies, `@overload` stubs and the unit's own name;
- the text of messages is blanked (`raise X("...")`, `warnings.warn`, `torch._check*` message arguments, assert
  messages), `if not c: raise AssertionError` reads as `assert c`, every `*.is_compiling` as one name, and
  `torch._C._log_api_usage_once(...)` calls and `@deprecated(...)` decorators are dropped;
- in assignment units every string constant is blanked (docstrings passed to `_add_docstr`).
What is left is what decides which ops a call dispatches. Pure `ast`: no torch import.
"""

from __future__ import annotations

import ast
import copy
import hashlib

MSG_CALLS = frozenset({"warn", "warn_once", "warning", "_check", "_check_value", "_check_type", "_check_index",
                       "_check_with", "_check_is_size", "_check_not_implemented", "TORCH_CHECK", "deprecated"})
_WARNINGS = ("warn", "warn_once", "warning")
_MESSAGES = (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call)
_FLIP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
         ast.NotIn: ast.In, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt}


class _Strip(ast.NodeTransformer):
    """Docstrings, annotations and TYPE_CHECKING bodies out."""

    @staticmethod
    def _body(body):
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        return body

    def _func(self, node):
        node.body = self._body(node.body)
        node.returns = None
        node.type_comment = None
        if hasattr(node, "type_params"):
            node.type_params = []
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _func

    def visit_ClassDef(self, node):
        node.body = self._body(node.body)
        self.generic_visit(node)
        return node

    def visit_arg(self, node):
        node.annotation = None
        node.type_comment = None
        return node

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=self.visit(node.value)), node)

    def visit_If(self, node):
        if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            return node.orelse or None
        self.generic_visit(node)
        return node


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _negate(test):
    """not test, simplified: not not x -> x; a != b -> a == b (one comparison); De Morgan over and/or."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return ast.Compare(test.left, [_FLIP[type(test.ops[0])]()], test.comparators)
    if isinstance(test, ast.BoolOp):
        return ast.BoolOp(ast.And() if isinstance(test.op, ast.Or) else ast.Or(), [_negate(v) for v in test.values])
    return ast.UnaryOp(ast.Not(), test)


class _Loose(ast.NodeTransformer):
    """Message texts blanked, assertion spellings and is_compiling unified, API-usage logging dropped."""

    MSG = ast.Constant("<msg>")

    def visit_Raise(self, node):
        if isinstance(node.exc, ast.Call):
            node.exc.args = [self.MSG if isinstance(a, _MESSAGES) else a for a in node.exc.args]
        return node

    def visit_If(self, node):
        body = node.body
        if len(body) == 1 and isinstance(body[0], ast.Raise) and not node.orelse:
            exc = body[0].exc
            name = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(name, ast.Name) and name.id == "AssertionError":
                return self.visit(ast.Assert(test=_negate(node.test), msg=None))
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node):
        if node.attr == "is_compiling":
            return ast.Name("is_compiling", ast.Load())
        self.generic_visit(node)
        return node

    def visit_Assert(self, node):
        node.msg = None
        self.generic_visit(node)
        return node

    def visit_Call(self, node):
        name = _called_name(node)
        if name in MSG_CALLS:
            keep_first = name not in _WARNINGS
            node.args = [a if i == 0 and keep_first else self.MSG
                         if isinstance(a, (ast.Constant, ast.JoinedStr, ast.Lambda, ast.BinOp)) else a
                         for i, a in enumerate(node.args)]
            node.keywords = [k for k in node.keywords if k.arg != "stacklevel"]
        self.generic_visit(node)
        return node

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call) and _called_name(node.value) == "_log_api_usage_once":
            return None
        self.generic_visit(node)
        return node

    def _func(self, node):
        node.decorator_list = [d for d in node.decorator_list
                               if not (isinstance(d, ast.Call) and _called_name(d) == "deprecated")]
        self.generic_visit(node)
        if not node.body:
            node.body = [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _func


class _Strings(ast.NodeTransformer):
    def visit_Constant(self, node):
        return ast.Constant("<str>") if isinstance(node.value, str) else node


def _fixed_bodies(tree):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module) and isinstance(getattr(node, "body", None), list) and not node.body:
            node.body = [ast.Pass()]
    return tree


def _decorator_name(d) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")


def _walk(body, prefix: str, out: dict) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not any(_decorator_name(d) in ("overload", "_overload") for d in node.decorator_list):
                out.setdefault(prefix + node.name, ("def", node))  # typing stubs skipped; first wins
        elif isinstance(node, ast.ClassDef):
            _walk(node.body, prefix + node.name + ".", out)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(node, "value", None) is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out[prefix + "<assign>" + target.id] = ("assign", node)
        elif isinstance(node, ast.If):  # version- or platform-guarded definitions
            _walk(node.body, prefix, out)
            _walk(node.orelse, prefix, out)
        elif isinstance(node, ast.Try):
            _walk(node.body, prefix, out)


def units(source: str) -> dict[str, tuple[str, ast.AST]]:
    """unit -> (kind "def" | "assign", its AST node, not normalized) of one file's source."""
    out: dict[str, tuple[str, ast.AST]] = {}
    _walk(ast.parse(source).body, "", out)
    return out


def normalized(kind: str, node: ast.AST) -> str:
    """The normalized dump of one unit (see the module docstring)."""
    node = copy.deepcopy(node)
    if kind == "assign":
        return ast.dump(_Strings().visit(_Strip().visit(node)), include_attributes=False)
    node.name = "<unit>"
    strict = _fixed_bodies(_Strip().visit(node))
    return ast.dump(_fixed_bodies(_Loose().visit(strict)), include_attributes=False)


def body_hash(text: str) -> str:
    """The 10-hex-digit hash the table stores."""
    return hashlib.sha1(text.encode()).hexdigest()[:10]  # noqa: S324 - a short stable id of code, not a secret


def unit_hashes(source: str, wanted=None) -> dict[str, str]:
    """unit -> the hash of its normalized body, for every unit of `source` (or those in `wanted`); {} when the
    source does not parse."""
    try:
        found = units(source)
    except SyntaxError:
        return {}
    return {u: body_hash(normalized(*found[u])) for u in found if wanted is None or u in wanted}
