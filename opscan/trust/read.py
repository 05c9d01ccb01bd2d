"""Spine: the one reader of YAML and JSON files opscan did not write itself in this run.

A report for `opscan repro`, `--baseline`, the leaderboards of `opscan zoo diff`, `accept --report` and
`--spec`, a zoo manifest and journal, a bundle's manifest and probes and the results that come back from a Mac
are read here and nowhere else, with the same limits:

- size: at most `max_bytes` (MAX_BYTES, SMALL_BYTES for hand-written files) — checked before reading;
- encoding: strict UTF-8;
- nesting: at most MAX_DEPTH levels of lists and mappings (no RecursionError later, in opscan or in yaml);
- YAML aliases: the events are counted before anything is built, and a document that would expand through
  its aliases to more than MAX_NODES values (an "alias bomb": a few hundred bytes, gigabytes once expanded)
  is refused up front; only yaml.SafeLoader builds it (plain data, no Python objects).

Each failure is one line naming the file, what is wrong and how to fix it, raised as the caller's error class
(a UsageError or one of its kin: exit 2). `json_value` parses one line of a JSON-lines journal with the same
limits and raises Malformed, for the journal's own one-line message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from opscan.errors import UsageError

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
    """One JSON value, at most MAX_DEPTH deep; Malformed naming the problem."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 text, byte {exc.start}: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise Malformed(f"JSONDecodeError at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if too_deep(value):
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels")
    return value


def yaml_value(text: str) -> Any:
    """One YAML document: its events are checked first (depth, alias expansion), then yaml.SafeLoader builds
    it; Malformed naming the problem (a syntax error with its line)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_events(yaml.parse(text, Loader=loader))
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoader (or its C twin): plain data only
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        if "nesting depth" in problem:  # libyaml's own limit (1000), met while it scans ahead of the events
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
        mark = getattr(exc, "problem_mark", None)
        raise Malformed(f"{f'line {mark.line + 1}: ' if mark else ''}{problem}") from None
    except RecursionError:
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None


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


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and mappings nest deeper than `limit` in `value` (walked without recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _line(what: str, path, problem: str, fix: str) -> str:
    return f"{what} {Path(path)} {problem} — {fix}"
