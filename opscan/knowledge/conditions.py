"""Knowledge stage: the small expression language of kernel_rules.yaml's `when` conditions, and its evaluator.

A condition is read over named values: a tensor argument is a `TensorArg` with `.dtype` ("float16"), `.shape`
(a tuple), `.dim` and `.numel`; a tensor list is a list of those; other arguments are their values (ints,
floats, bools, strings, lists, None); `macos` is the assumed macOS version as a tuple, e.g. (14, 0). Python's
`and`, `or`, `not`, comparisons, `in`, subscripts, tuples, lists, numbers, strings, arithmetic, `len()`, and
`any()` / `all()` over a generator are allowed; nothing else is (`compile_when` raises ValueError).

`evaluate_when(rule, names, macos)` is True when the condition holds, False when it does not, None when the call
lacks what it reads (a name not recorded, a size -1 under fake tensors). No torch import.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
          ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Name,
          ast.Load, ast.Attribute, ast.Subscript, ast.Constant, ast.Tuple, ast.List, ast.Call,
          ast.GeneratorExp, ast.comprehension, ast.Store, ast.BinOp, ast.Mult, ast.Add, ast.Sub, ast.Mod,
          ast.Pow)
_ATTRS = ("dtype", "shape", "dim", "numel")
_CALLS = ("len", "any", "all")


@dataclass(frozen=True)
class TensorArg:
    """What a trace knows of one tensor argument."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def dim(self) -> int:
        """Its rank."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Its element count (negative when a size is unknown)."""
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Unknown(Exception):
    """The call lacks what the condition reads."""


def evaluate_when(rule, args: Mapping[str, object] | None, macos: tuple[int, int]) -> bool | None:
    """Whether `rule`'s compiled condition (`rule.code`) holds for a call with `args` (None: not decidable)."""
    if args is None:
        return None
    names = {**args, "macos": macos}
    try:
        return bool(_eval(rule.code.body, names))
    except (_Unknown, IndexError, KeyError, TypeError, AttributeError):
        return None


def _eval(node, names):
    """Evaluate one node of a compiled `when` expression."""
    handler = _HANDLERS.get(type(node))
    if handler is None:
        raise ValueError(f"unsupported expression {ast.dump(node)}")
    return handler(node, names)


def _name(node: ast.Name, names):
    if node.id not in names:
        raise _Unknown(node.id)  # an argument the call did not record
    return names[node.id]


def _attribute(node: ast.Attribute, names):
    value = getattr(_eval(node.value, names), node.attr)
    if node.attr == "shape" and any(d < 0 for d in value):
        raise _Unknown("a size known only at run time")
    return value


def _boolop(node: ast.BoolOp, names):
    values = (_eval(v, names) for v in node.values)
    return all(values) if isinstance(node.op, ast.And) else any(values)


def _unary(node: ast.UnaryOp, names):
    value = _eval(node.operand, names)
    return (not value) if isinstance(node.op, ast.Not) else -value


def _binop(op, a, b):
    return {ast.Mult: lambda: a * b, ast.Add: lambda: a + b, ast.Sub: lambda: a - b,
            ast.Mod: lambda: a % b, ast.Pow: lambda: a ** b}[type(op)]()


def _compare(node: ast.Compare, names) -> bool:
    left = _eval(node.left, names)
    for op, right_node in zip(node.ops, node.comparators):
        right = _eval(right_node, names)
        ok = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right, ast.Lt: lambda: left < right,
              ast.LtE: lambda: left <= right, ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right,
              ast.In: lambda: left in right, ast.NotIn: lambda: left not in right,
              ast.Is: lambda: left is right, ast.IsNot: lambda: left is not right}[type(op)]()
        if not ok:
            return False
        left = right
    return True


def _call(node: ast.Call, names):
    fn = node.func.id
    if fn == "len":
        return len(_eval(node.args[0], names))
    gen = node.args[0]
    comp = gen.generators[0]
    items = (_eval(gen.elt, {**names, comp.target.id: item}) for item in _eval(comp.iter, names))
    return any(items) if fn == "any" else all(items)


_HANDLERS = {
    ast.Constant: lambda node, names: node.value,
    ast.Name: _name,
    ast.Attribute: _attribute,
    ast.Subscript: lambda node, names: _eval(node.value, names)[_eval(node.slice, names)],
    ast.Tuple: lambda node, names: tuple(_eval(e, names) for e in node.elts),
    ast.List: lambda node, names: tuple(_eval(e, names) for e in node.elts),
    ast.BoolOp: _boolop,
    ast.UnaryOp: _unary,
    ast.BinOp: lambda node, names: _binop(node.op, _eval(node.left, names), _eval(node.right, names)),
    ast.Compare: lambda node, names: _compare(node, names),
    ast.Call: lambda node, names: _call(node, names),
}


def compile_when(text: str) -> ast.Expression:
    """Parse a `when` expression, refusing anything outside the language (ValueError)."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise ValueError(f"{text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Attribute) and node.attr not in _ATTRS:
            raise ValueError(f"{text!r}: attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.func.id not in _CALLS):
            raise ValueError(f"{text!r}: only {', '.join(_CALLS)} may be called")
    return tree
