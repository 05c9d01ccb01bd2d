"""Spine: the one reader of YAML and JSON files opscan did not write itself in this run.

A report for `opscan repro`, `--baseline`, the leaderboards of `opscan zoo diff`, `accept --report` and
`--spec`, a zoo manifest and journal, a bundle's manifest and probes and the results that come back from a Mac
are read here and nowhere else, with the same limits:

- size: at most `max_bytes` (MAX_BYTES, SMALL_BYTES for hand-written files) — checked before reading;
- encoding: strict UTF-8;
- nesting: at most MAX_DEPTH levels of lists and mappings (no RecursionError later, in opscan or in yaml);
- YAML aliases: the events are counted before anything is built, and a document that would expand through
  its aliases to more than MAX_NODES values (an "alias bomb": a few hundred bytes, gigabytes once expanded)
  is refused up front; only yaml.SafeLoader builds it (plain data, no Python objects);
- values: every error building a value can raise is caught and named by its field (`ops[3].calls: ...`; YAML
  adds the line and column): an integer longer than Python converts (sys.get_int_max_str_digits), a YAML int,
  float or date longer than that or impossible (`2023-02-30`); what JSON does not allow (NaN, Infinity, a
  number that overflows a float) and a lone UTF-16 surrogate (`"\\ud800"`: not text, no file can hold it) too.

Each failure is one line naming the file, what is wrong and how to fix it, raised as the caller's error class
(a UsageError or one of its kin: exit 2). `json_value` parses one line of a JSON-lines journal with the same
limits and raises Malformed, for the journal's own one-line message.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from opscan.errors import UsageError
from opscan.trust.text import printable

MAX_BYTES = 512 * 1024 * 1024  # a report.json of the largest step opscan scans is a few hundred MB at most
SMALL_BYTES = 16 * 1024 * 1024  # hand-written files: a zoo manifest, an acceptance spec
MAX_DEPTH = 64  # no file opscan writes nests deeper than about 12
MAX_NODES = 2_000_000  # values in a YAML document once its aliases are expanded


class Malformed(ValueError):
    """One value that cannot be used: its problem, for the caller's one line."""


def read_json(path, what: str, fix: str, *, expected: str | None = None, error=UsageError,
              max_bytes: int = MAX_BYTES) -> Any:
    """The JSON document at `path`; `error(line)` when it cannot be read or used (`what`: "the baseline";
    `expected`: "an opscan report.json", said when it is not JSON at all)."""
    text = read_text(path, what, fix, error=error, max_bytes=max_bytes)
    try:
        return json_value(text)
    except Malformed as exc:
        raise error(_line(what, path, f"is not {expected or 'valid JSON'} ({exc})", fix)) from None


def read_yaml(path, what: str, fix: str, *, expected: str | None = None, error=UsageError,
              max_bytes: int = SMALL_BYTES) -> Any:
    """The YAML document at `path`, through yaml.SafeLoader once its depth and alias expansion are known to be
    within the limits; `error(line)` otherwise."""
    text = read_text(path, what, fix, error=error, max_bytes=max_bytes)
    try:
        return yaml_value(text)
    except Malformed as exc:
        raise error(_line(what, path, f"is not {expected or 'valid YAML'} ({exc})", fix)) from None


def read_text(path, what: str, fix: str, *, error=UsageError, max_bytes: int = MAX_BYTES) -> str:
    """The file as strict UTF-8 text, at most `max_bytes` long."""
    return decoded(read_bytes(path, what, fix, error=error, max_bytes=max_bytes), path, what, fix, error)


def read_bytes(path, what: str, fix: str, *, error=UsageError, max_bytes: int = MAX_BYTES) -> bytes:
    """The file's bytes, at most `max_bytes` of them (a larger file is refused before it is read)."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(max_bytes + 1) if size <= max_bytes else b""
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc} ({type(exc).__name__}) — {fix}") from None
    if size > max_bytes or len(data) > max_bytes:
        raise error(_line(what, path, f"is larger than opscan reads ({max(size, len(data))} bytes, at most "
                                      f"{max_bytes})", fix))
    return data


def decoded(data: bytes, path, what: str, fix: str, error=UsageError) -> str:
    """`data` as strict UTF-8 text; `error(line)` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(_line(what, path, f"is not UTF-8 text (byte {exc.start}: {exc.reason})", fix)) from None


def json_value(text: str | bytes) -> Any:
    """One JSON value, at most MAX_DEPTH deep, every number finite and every string text; Malformed naming the
    problem and its field."""
    try:
        value = json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 text, byte {exc.start}: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise Malformed(f"JSONDecodeError at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError:  # an integer longer than int() converts: read again, marking it, to name its field
        try:
            value = json.loads(text, parse_constant=_constant, parse_int=_integer)
        except RecursionError:
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    _check_values(value, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value


class _Bad:
    """A JSON value that was read but cannot be used (what is wrong with it), until its field is named."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a JSON number")


def _integer(digits: str) -> int | _Bad:
    try:
        return int(digits)
    except ValueError:
        return _Bad(f"an integer of {len(digits.lstrip('-'))} digits, more than Python converts "
                    f"(sys.get_int_max_str_digits: {sys.get_int_max_str_digits()})")


def _problem(value: Any, strings: bool, floats: bool) -> str | None:
    """What is wrong with one scalar value (None: nothing)."""
    if isinstance(value, _Bad):
        return value.why
    if floats and isinstance(value, float) and not math.isfinite(value):
        return f"a number too large for a float ({value})"
    if strings and isinstance(value, str) and _SURROGATE.search(value):
        return f"a lone surrogate ({_SURROGATE.search(value).group().encode('unicode_escape').decode()}), not text"
    return None


def _check_values(value: Any, strings: bool, floats: bool = True) -> None:
    """Malformed for a value nested deeper than MAX_DEPTH, or the first scalar (a key, when `strings`) that cannot
    be used, named by its field; walked without recursion. `floats=False`: non-finite floats are fine (YAML's
    .inf)."""
    suspect = (_Bad, float, str) if strings else (_Bad, float) if floats else (_Bad,)
    stack = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if not isinstance(item, (dict, list)):
            why = _problem(item, strings, floats)
            if why:
                raise Malformed(f"{field_name(path)}: {why}")
            continue
        if depth > MAX_DEPTH:
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels")
        for key, child in item.items() if isinstance(item, dict) else enumerate(item):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, (*path, key)))
            elif isinstance(child, suspect):
                why = _problem(child, strings, floats)
                if why:
                    raise Malformed(f"{field_name((*path, key))}: {why}")
            if strings and isinstance(key, str) and _SURROGATE.search(key):
                raise Malformed(f"{field_name((*path, key))}: {_problem(key, strings, floats)} in its name")


def field_name(path: tuple) -> str:
    """`ops[3].calls` for the path ("ops", 3, "calls"); "the document" for the value itself."""
    text = ""
    for key in path:
        if isinstance(key, int) and not isinstance(key, bool):
            text += f"[{key}]"
        else:
            name = str(key)[:60] if not isinstance(key, _Bad) else "(a key)"
            plain = name.isidentifier() or name.replace("-", "_").replace(".", "_").isidentifier()
            text += (("." if text else "") + name) if plain and "." not in name else f"[{name!r}]"
    return printable(text, newlines=False) or "the document"


def yaml_value(text: str) -> Any:
    """One YAML document: its events are checked first (depth, alias expansion), then yaml.SafeLoader builds
    it; Malformed naming the problem (a syntax error with its line, a value that cannot be built with its
    field, line and column)."""
    import yaml

    try:
        _check_events(yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
        loader = _yaml_loader()(text)
        try:
            root = loader.get_single_node()
            value = loader.construct_document(root) if root is not None else None
        except _Unbuildable as exc:
            raise Malformed(exc.line(root)) from None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        if "nesting depth" in problem:  # libyaml's own limit (1000), met while it scans ahead of the events
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
        mark = getattr(exc, "problem_mark", None)
        raise Malformed(f"{f'line {mark.line + 1}: ' if mark else ''}{problem}") from None
    except RecursionError:
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
    _check_values(value, strings=True, floats=False)
    return value


class _Unbuildable(Exception):  # noqa: N818 - internal: carries the node to yaml_value, never leaves this module
    """A YAML scalar whose value cannot be built (an impossible date, an integer too long to convert)."""

    TAGS = {"int": "an integer", "float": "a number", "timestamp": "a date", "binary": "base64 data"}

    def __init__(self, node, exc: Exception) -> None:
        super().__init__(str(exc))
        self.node, self.exc = node, exc

    def line(self, root) -> str:
        mark, kind = self.node.start_mark, str(self.node.tag).rpartition(":")[2]
        value = printable(repr(self.node.value)[:60], newlines=False)
        return (f"{field_name(_node_path(root, self.node) or ())} (line {mark.line + 1}, column {mark.column + 1}): "
                f"{value} is not {self.TAGS.get(kind, 'a value of ' + kind)} opscan can read "
                f"({printable(str(self.exc)[:100], newlines=False)})")


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    """yaml.SafeLoader (its C twin when present) whose value errors name their node, and whose ints and floats are
    at most as long as Python converts (a sexagesimal `1:2:3:...` of megabytes would take hours); made once."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep)
            except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
                raise _Unbuildable(node, exc) from None

        def construct_yaml_int(self, node):
            _short(node)
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node):
            _short(node)
            return super().construct_yaml_float(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_yaml_float)
    return Loader


def _short(node) -> None:
    limit = sys.get_int_max_str_digits() or 4300
    if len(str(node.value)) > limit:
        raise ValueError(f"{len(str(node.value))} characters, more than Python converts "
                         f"(sys.get_int_max_str_digits: {limit})")


def _node_path(root, target) -> tuple | None:
    """The keys and indexes from `root` to `target` in a YAML node graph (None: not found); depth-first, each
    node once (aliases share nodes)."""
    stack, seen = [(root, ())], set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node.value, list):
            for index, child in enumerate(node.value):
                if isinstance(child, tuple):  # a mapping's (key node, value node)
                    key = child[0].value if isinstance(child[0].value, str) else "(a key)"
                    stack += [(child[1], (*path, key)), (child[0], (*path, key))]
                else:
                    stack.append((child, (*path, index)))
    return None


def _check_events(events) -> None:
    """Refuse a document deeper than MAX_DEPTH or larger than MAX_NODES values once its aliases are expanded,
    before any of it is built (an anchored node counts what it holds; each alias of it counts that again)."""
    import yaml

    starts, anchors, expanded = [], {}, 0
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            starts.append((expanded, event.anchor))
            expanded += 1
            if len(starts) > MAX_DEPTH:
                raise Malformed(f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            start, anchor = starts.pop()
            if anchor:
                anchors[anchor] = expanded - start
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            if event.anchor:
                anchors[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            expanded += anchors.get(event.anchor, 1)
        if expanded > MAX_NODES:
            raise Malformed(f"its aliases expand it to more than {MAX_NODES} values (an alias bomb?)")


def _line(what: str, path, problem: str, fix: str) -> str:
    return f"{what} {Path(path)} {problem} — {fix}"
