"""Knowledge stage: the kernel checks opscan encodes (`kernel_rules.yaml`) and the evaluator of their conditions.

kernel_checks.txt lists every runtime check of every release's MPS kernels (read from the binaries); this
module holds the ones whose failure condition opscan can decide from a traced call. Each rule of
kernel_rules.yaml names its check by message and source file, gives the C++ condition as read in the source
(`condition`, with `source` naming file, function and commit), the schema names of the op's arguments
(`args`) and `when`: the same condition written in a small expression language over those arguments:

* a tensor argument has `.dtype` ("float16"), `.shape` (a tuple), `.dim` and `.numel`; a tensor list is a
  list of those; other arguments are their values (ints, floats, bools, strings, lists, None);
* `macos` is the assumed macOS version as a tuple, e.g. (14, 0);
* Python's `and`, `or`, `not`, comparisons, `in`, subscripts, tuples, lists, numbers, strings, `len()`,
  `any()` / `all()` over a generator are allowed; nothing else is (ValueError when the file loads).

`evaluate(rule, args, macos)` is True when the kernel would raise for the call, False when it would
not, None when the call lacks what the condition reads (an argument not recorded, a size -1 under fake
tensors). No torch import.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from opscan.opkey import Release

RULES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_rules.yaml")
VERDICTS = ("error", "unsupported_dtype")
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


@dataclass(frozen=True)
class KernelRule:
    """One encoded kernel check."""

    id: str
    message: str  # the check's message in kernel_checks.txt (exact)
    file: str  # the source file's name (Convolution.mm)
    ops: tuple[str, ...]  # yaml spellings of the MPS-view ops it is evaluated for
    args: tuple[str, ...]  # the op's argument names, in schema order
    kind: str  # dtype | rank | size | flag | macos, joined with "+"
    condition: str  # the C++ failure condition as read
    when: str  # the same, in the expression language
    verdict: str  # error | unsupported_dtype
    remedy: str
    source: str  # where the condition was read
    code: ast.Expression
    first_tensor: bool = False  # a message pattern's rule: `self` is the call's first tensor argument


class _Unknown(Exception):
    """The call lacks what the condition reads."""


def evaluate(rule: KernelRule, args: Mapping[str, object] | None, macos: tuple[int, int]) -> bool | None:
    """Whether the kernel raises for a call with `args` (None: not decidable from them)."""
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


def parse_rules(text: str) -> tuple[KernelRule, ...]:
    """kernel_rules.yaml text -> rules (ValueError on a bad entry)."""
    data = yaml.safe_load(text) or {}
    rules, seen = [], set()
    for raw in data.get("rules", ()):
        missing = {"id", "message", "file", "ops", "args", "kind", "condition", "when", "verdict", "remedy",
                   "source"} - set(raw)
        if missing or raw["verdict"] not in VERDICTS or raw["id"] in seen:
            raise ValueError(f"kernel_rules.yaml: bad rule {raw.get('id')!r} (missing {sorted(missing)})")
        seen.add(raw["id"])
        rules.append(KernelRule(raw["id"], raw["message"], raw["file"], tuple(raw["ops"]), tuple(raw["args"]),
                                raw["kind"], raw["condition"], raw["when"], raw["verdict"], raw["remedy"],
                                raw["source"], compile_when(raw["when"])))
    return tuple(rules)


@dataclass(frozen=True)
class Pattern:
    """A family of checks encoded from their message (kernel_rules.yaml `patterns`)."""

    id: str
    match: re.Pattern
    kind: str
    when: str
    verdict: str
    remedy: str
    source: str
    code: ast.Expression

    def rule(self, check) -> KernelRule | None:
        """The rule encoding `check`, when its message matches and its kind includes this pattern's."""
        if not self.match.search(check.message.strip()) or self.kind not in check.kind.split("+"):
            return None
        condition = f"read from the message '{check.message.strip()}'"
        return KernelRule(self.id, check.message, check.file.rsplit("/", 1)[-1], check.ops, ("self",), self.kind,
                          condition, self.when, self.verdict, self.remedy, self.source, self.code, True)


def parse_patterns(text: str) -> tuple[Pattern, ...]:
    """kernel_rules.yaml text -> its message patterns (ValueError on a bad entry)."""
    out = []
    for raw in (yaml.safe_load(text) or {}).get("patterns", ()):
        if set(raw) != {"id", "match", "kind", "when", "verdict", "remedy", "source"} or raw["verdict"] not in VERDICTS:
            raise ValueError(f"kernel_rules.yaml: bad pattern {raw.get('id')!r}")
        out.append(Pattern(raw["id"], re.compile(raw["match"]), raw["kind"], raw["when"], raw["verdict"],
                           raw["remedy"], raw["source"], compile_when(raw["when"])))
    return tuple(out)


@functools.lru_cache(maxsize=2)
def load_rules(path: str = RULES_PATH) -> tuple[KernelRule, ...]:
    """The shipped rules."""
    with open(path, encoding="utf-8") as fh:
        return parse_rules(fh.read())


@functools.lru_cache(maxsize=2)
def load_patterns(path: str = RULES_PATH) -> tuple[Pattern, ...]:
    """The shipped message patterns."""
    with open(path, encoding="utf-8") as fh:
        return parse_patterns(fh.read())


def rule_for(check, rules: tuple[KernelRule, ...]) -> KernelRule | None:
    """The rule that encodes a kernel check (same message, spaces aside, and same file), or None."""
    text = _plain(check.message)
    return next((r for r in rules if _plain(r.message) == text and check.file.endswith("/" + r.file)), None)


def _plain(message: str) -> str:
    return " ".join(message.split())


@dataclass(frozen=True, eq=False)
class Limits:
    """The runtime checks of one release's MPS kernels, and the encoded ones among them."""

    release: str  # the release whose binary the checks were read from
    by_op: Mapping[str, tuple]  # yaml overload name -> KernelChecks its MPS kernel has
    encoded: tuple[tuple[KernelRule, object], ...]  # (rule, its KernelCheck in this release)
    total: int  # checks of the release
    rules_by_op: Mapping[str, tuple] = None  # yaml name -> its (rule, check) pairs (built by release_limits)

    def rules_for(self, yaml_name: str) -> tuple[tuple[KernelRule, object], ...]:
        """The encoded checks evaluated for an op."""
        return self.rules_by_op.get(yaml_name, ())

    def unmodelled(self, yaml_name: str) -> tuple:
        """The op's checks that no rule encodes."""
        ids = {c.id for _, c in self.encoded}
        return tuple(c for c in self.by_op.get(yaml_name, ()) if c.id not in ids)


def release_limits(release: str) -> Limits | None:
    """The Limits of `release` (the newest release read when it is newer than the file; None without it)."""
    from opscan.knowledge.kernel_checks import load_checks

    checks = load_checks()
    if checks is None or not checks.releases:
        return None
    read = release if release in checks.releases else None
    if read is None and Release.parse(release) > Release.parse(checks.releases[-1]):
        read = checks.releases[-1]
    if read is None:
        return None
    return _limits(checks, read)


@functools.lru_cache(maxsize=64)
def _limits(checks, release: str) -> Limits:
    """release_limits (cached)."""
    rules, patterns = load_rules(), load_patterns()
    encoded = []
    for check in checks.checks:
        if release not in check.releases:
            continue
        rule = rule_for(check, rules) or next((r for p in patterns if (r := p.rule(check))), None)
        if rule is not None:
            encoded.append((rule, check))
    by_op: dict[str, list] = {}
    for rule, check in encoded:
        for op in rule.ops:
            by_op.setdefault(op, []).append((rule, check))
    return Limits(release, checks.for_release(release), tuple(encoded), checks.count(release),
                  MappingProxyType({k: tuple(v) for k, v in by_op.items()}))
