"""Knowledge stage: the small expression language of kernel_rules.yaml's `when` conditions, and its evaluator.

A condition is read over named values: a tensor argument is a `TensorArg` with `.dtype` ("float16"), `.shape`
(a tuple), `.dim` and `.numel`, and where the trace recorded them `.stride` (a tuple of element strides),
`.storage_offset`, `.device` ("mps", or "cpu" for a tensor that stays on the host while the step runs on MPS),
`.requires_grad`, `.itemsize` (bytes per element) and the derived `.is_contiguous`, `.is_channels_last_contiguous`
(channels_last / channels_last_3d by rank), `.looks_channels_last` (strides that suggest channels_last, exact or
not: `suggest_memory_format`), `.max_elem_offset` (the largest element index the view reaches in its storage);
a tensor list is a list of those; other arguments are their values (ints, floats, bools, strings, lists, None);
`macos` is the assumed macOS version as a tuple, e.g. (14, 0); `result` is the tensor the op writes (the `out=`
tensor, `self` of an in-place op, else its first output) and `chip` the chip family the user named (`--chip`,
"M1".."M5"; a condition that reads `chip` is undecided without one). Python's
`and`, `or`, `not`, comparisons, `in`, subscripts and slices (`A.shape[:-2]`: the batch dimensions, a tuple),
tuples, lists, numbers, strings, arithmetic, `len()`, and `any()` / `all()` over a generator are allowed; nothing
else is (`compile_when` raises ValueError).

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
          ast.Pow, ast.Slice)
_ATTRS = ("dtype", "shape", "dim", "numel", "stride", "storage_offset", "device", "requires_grad", "itemsize",
          "is_contiguous", "is_channels_last_contiguous", "looks_channels_last", "max_elem_offset")
_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int16": 2, "uint16": 2,
             "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4, "complex32": 4, "int64": 8,
             "uint64": 8, "float64": 8, "complex64": 8, "complex128": 16}
_CALLS = ("len", "any", "all")


@dataclass(frozen=True)
class TensorArg:
    """What a trace knows of one tensor argument."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None  # None: not recorded (a condition reading it is undecided)
    storage_offset: int | None = None
    device: str | None = None  # "mps" | "cpu" (stays on the host on a Mac)
    requires_grad: bool | None = None

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

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self.dtype]

    def _strides(self) -> tuple[int, ...]:
        if self.stride is None or any(s < 0 for s in self.stride) or any(d < 0 for d in self.shape):
            raise _Unknown("strides not recorded, or known only at run time")
        return self.stride

    @property
    def is_contiguous(self) -> bool:
        """`t.is_contiguous()`: dense row-major (sizes of 1 and empty tensors ignore their stride)."""
        return _dense_in(self.shape, self._strides(), range(len(self.shape) - 1, -1, -1))

    @property
    def is_channels_last_contiguous(self) -> bool:
        """`t.is_contiguous(memory_format=channels_last)` (rank 4) or channels_last_3d (rank 5)."""
        n = len(self.shape)
        if n not in (4, 5):
            return False
        return _dense_in(self.shape, self._strides(), (1, *range(n - 1, 1, -1), 0))

    @property
    def looks_channels_last(self) -> bool:
        """`t.suggest_memory_format() == channels_last(_3d)` (c10's is_channels_last_strides_2d/3d): the strides
        order the channels innermost, then the spatial dimensions, then the batch — inexact, so a channel slice of
        an NHWC tensor looks channels_last too."""
        n, stride = len(self.shape), self._strides()
        if n not in (4, 5) or stride[1] == 0:
            return False
        low = 0
        for d in (1, *range(n - 1, 1, -1), 0):
            if self.shape[d] == 0 or stride[d] < low or (d == 0 and low == stride[1]):
                return False
            low = stride[d] * (self.shape[d] if self.shape[d] > 1 else 1)
        return True

    @property
    def max_elem_offset(self) -> int:
        """storage_offset + sum((size - 1) * stride): the largest element index the view reaches."""
        if self.storage_offset is None:
            raise _Unknown("storage offset not recorded")
        return self.storage_offset + sum((d - 1) * s for d, s in zip(self.shape, self._strides()) if d > 0)


def _dense_in(shape, stride, order) -> bool:
    """Whether (shape, stride) is dense with dimensions laid out innermost-first in `order`."""
    if any(d == 0 for d in shape):
        return True
    expected = 1
    for d in order:
        if shape[d] == 1:
            continue
        if stride[d] != expected:
            return False
        expected *= shape[d]
    return True


class _Unknown(Exception):
    """The call lacks what the condition reads."""


def evaluate_when(rule, args: Mapping[str, object] | None, macos: tuple[int, int],
                  chip: str | None = None) -> bool | None:
    """Whether `rule`'s compiled condition (`rule.code`) holds for a call with `args` (None: not decidable)."""
    if args is None:
        return None
    names = {**args, "macos": macos, "chip": chip}
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
    if node.id not in names or (node.id == "chip" and names["chip"] is None):
        raise _Unknown(node.id)  # an argument the call did not record
    return names[node.id]


def _attribute(node: ast.Attribute, names):
    value = getattr(_eval(node.value, names), node.attr)
    if value is None and node.attr in _RECORDED:
        raise _Unknown(f"{node.attr} not recorded")  # a call traced before the trace recorded it
    if node.attr == "shape" and any(d < 0 for d in value):
        raise _Unknown("a size known only at run time")
    return value


_RECORDED = frozenset({"stride", "storage_offset", "device", "requires_grad"})


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
    ast.Slice: lambda node, names: slice(*(None if part is None else _eval(part, names)
                                           for part in (node.lower, node.upper, node.step))),
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


def names_read(code: ast.Expression) -> frozenset[str]:
    """The argument names a compiled condition reads (`macos`, `chip` and its generators' own variables aside)."""
    own = {n.target.id for n in ast.walk(code) if isinstance(n, ast.comprehension)}
    return frozenset(n.id for n in ast.walk(code) if isinstance(n, ast.Name) and n.id not in own
                     and n.id not in ("macos", "chip") and n.id not in _CALLS)
