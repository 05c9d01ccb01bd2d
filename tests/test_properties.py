"""Property-based tests of the readers and writers (issue 36): arbitrary text — control characters, escape
sequences, line breaks with a GitHub workflow command, Markdown and HTML, formula starters, home folders — and
values of the wrong type through every field of a report, a results line and a zoo manifest, with the contract
each must keep: the readers return a value or raise the library's error (exit 2), never another exception; the
writers keep their format (strict JSON, YAML that reads back, well-formed XML, CSV without formulas, one line per
workflow command) and the terminal gets no control character and no line that starts a workflow command; `opscan
repro` on a crafted report exits 0, 1 or 2, prints parseable paths and writes nothing outside -o.

Bounded for CI: each property has an explicit example budget (`max_examples`), no per-example deadline (a shared,
busy machine must not make them flaky: the budget bounds them, a few seconds each) and `derandomize=True` (the
same examples on every run: a failure reproduces on any machine). Nothing is stored between runs.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TARGETS
from opscan.errors import OpscanError

BOUNDED = dict(deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIAL = ["\n::error file=x.py,line=1::forged", "\r\n::warning::x", "::add-mask::x", "\x1b[2J\x1b]0;t\x07", "\x00",
           "\u202eevil", "<script>alert(1)</script>", "<!-- -->", "`", "```", "|", "[x](http://e)", "@user", "# h",
           "=SUM(1)", "+1", "-1", "@A1", "%0A%25", "/Users/alice/x", "..", "../../etc/passwd", "\ud800"[:0] + "é",
           "\U0001d400" * 5, "NaN", "]]>", "&amp;", "'", '"', "\\", "\t", " "]
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(SPECIAL),
                 st.lists(st.sampled_from(SPECIAL), min_size=2, max_size=4).map("".join))
LONG_INT = "<<an integer longer than int() converts>>"  # swapped for 5000 digits in the JSON text (dumps())
VALUES = st.one_of(TEXT, st.none(), st.booleans(), st.integers(), st.floats(), st.just(LONG_INT),
                   st.lists(TEXT, max_size=2), st.dictionaries(TEXT, TEXT, max_size=2))
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def dumps(value, **kwargs) -> str:
    """json.dumps, NaN and Infinity included (not JSON: the readers must refuse them), LONG_INT as 5000 digits."""
    return json.dumps(value, **kwargs).replace(json.dumps(LONG_INT), "9" * 5000)


def strict_loads(text: str):
    """json.loads that refuses what is not JSON (NaN, Infinity)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def no_command_lines(text: str) -> bool:
    """No line starts (after blanks) with `::`: nothing a GitHub runner reads as a workflow command."""
    return not any(line.lstrip(" \t").startswith("::") for line in text.splitlines())


def terminal_clean(text: str) -> bool:
    """No control character but line breaks, and no line that starts a workflow command."""
    return not CONTROL.search(text) and no_command_lines(text)


# --- the writers: a report whose every text field is arbitrary ------------------------------------------------


def _report(texts: list[str]):
    from helpers_report import report, row
    from opscan.verdict import Verdict

    t = itertools.cycle(texts)
    place = {"file": next(t), "line": 3, "function": next(t), "phases": ["forward"], "calls": 1,
             "via": {"file": next(t), "line": 9, "function": next(t)}}
    rows = (row("aten::take", [next(t), "int64"], Verdict.UNSUPPORTED, [next(t), next(t)], text=next(t),
                remedy=next(t)),
            row("aten::add.Tensor", ["float32"], Verdict.CPU_FALLBACK, [next(t)], text=next(t)))
    rows = (rows[0].__class__(**{**rows[0].__dict__, "where": (place,)}), rows[1])
    base = report(rows)
    return base.__class__(**{**base.__dict__, "model": next(t), "model_name": next(t),
                             "environment": {"python": next(t), "note": next(t)}})


@settings(max_examples=30, **BOUNDED)
@given(st.lists(TEXT, min_size=4, max_size=12))
def test_every_format_keeps_its_shape_whatever_the_text(texts):
    from opscan.render import FORMATS

    report = _report(texts)
    table = FORMATS["table"](report, verbose=True, tree=True, width=100)
    assert terminal_clean(table), table
    assert strict_loads(FORMATS["json"](report)) == json.loads(report.to_json())
    assert yaml.safe_load(FORMATS["yaml"](report)) == report.to_dict() and no_command_lines(FORMATS["yaml"](report))
    assert ET.fromstring(FORMATS["junit"](report)).tag == "testsuites"
    sarif = strict_loads(FORMATS["sarif"](report))
    assert all(not CONTROL.search(r["message"]["text"]) for r in sarif["runs"][0]["results"])
    lines = FORMATS["github"](report).splitlines()
    assert lines and all(re.match(r"::(error|warning|notice)( [^:]*)?::", line) for line in lines), lines
    assert len(lines) == len(report.findings)  # one command each: nothing started another
    page = FORMATS["html"](report)
    assert no_command_lines(page) and page.count("<script") == FORMATS["html"](_report(["x"])).count("<script")


# --- the reader: arbitrary JSON and YAML ---------------------------------------------------------------------


JSON_VALUES = st.recursive(VALUES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(TEXT, inner, max_size=3)), max_leaves=12)


@settings(max_examples=150, **BOUNDED)
@given(JSON_VALUES)
def test_the_reader_gives_a_strict_value_or_malformed_for_any_json(value):
    from opscan.trust.read import Malformed, json_value
    from opscan.trust.text import strict_json

    text = dumps(value)  # NaN, Infinity and integers too long to convert included
    try:
        read = json_value(text)
    except Malformed:
        return
    assert strict_loads(strict_json(read)) == json.loads(strict_json(read))


@settings(max_examples=150, **BOUNDED)
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(
    ["a: ", "- ", "2023-02-30", "1:2:3", "!!binary x", "&a ", "*a", "{", "[", "? ", ".inf", "9" * 5000, "\n",
     "  ", '"\\ud800"', "<<: *a", "'", "#"]), max_size=12).map("".join)))
def test_the_reader_gives_a_value_or_malformed_for_any_yaml(text):
    from opscan.trust.read import Malformed, yaml_value

    try:
        yaml_value(text)
    except Malformed:
        pass


# --- `opscan repro` on a report whose fields are arbitrary ----------------------------------------------------


@pytest.fixture(scope="module")
def take_report(tmp_path_factory):
    from opscan.cli import main

    out = tmp_path_factory.mktemp("take") / "out"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main([f"{TARGETS / 'baseline_pair.py'}:build_model", "--arg", "take=True", "--repro", "-o",
                     str(out), "--no-memory", "--no-fx", "-q"]) == 0
    return json.loads((out / "report.json").read_text())


def _leaves(value, path=()):
    """The paths of every scalar in a JSON value (the base64 data blocks left out: values, not text)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() if k not in ("inline", "feed_inline") for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


def _set(value, path, new):
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@settings(max_examples=40, **BOUNDED)
@given(data=st.data())
def test_opscan_repro_keeps_the_contract_on_any_report_field(take_report, data):
    from opscan.cli import main

    report = copy.deepcopy(take_report)
    paths = sorted(_leaves(report), key=repr)
    for path in data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
        _set(report, path, data.draw(VALUES))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "report.json").write_text(dumps(report))  # NaN written raw: the reader must refuse it
        before = _files(root)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["repro", str(root / "report.json"), "aten::take", "-o", str(root / "out")])
        assert code in (0, 1, 2), err.getvalue()
        assert "Traceback" not in err.getvalue() and terminal_clean(err.getvalue()), err.getvalue()
        outside = {f for f in _files(root) - before if not f.startswith("out")}
        assert outside == set(), outside
        written = out.getvalue().splitlines()
        assert all(Path(p).is_file() and Path(p).resolve().is_relative_to((root / "out").resolve())
                   for p in written), written
        assert code != 0 or written


# --- a results line from a Mac --------------------------------------------------------------------------------


class _Probe:
    def __init__(self, probe_id: str):
        self.id = probe_id


def _results_file(folder: Path, outcome: dict, environment: dict) -> Path:
    from opscan.bundle.results import digest

    lines = [{"kind": "header", "journal": 1, "results": 1, "bundle": "b" * 64, "workers": 1, "timeout_s": 60,
              "isolation": "spawn", "on_pass": "raised"},
             {"kind": "environment", "pass": "off", "environment": environment},
             {"kind": "outcome", **outcome}]
    body = "".join(dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    path = folder / "results.jsonl"
    path.write_bytes(body + (json.dumps({"kind": "end", "counts": {}, "digest": digest(body)}) + "\n").encode())
    return path


OUTCOME = {"probe": "p1", "pass_name": "off", "status": "ran", "exc_type": None, "message": None, "warnings": [],
           "fallback_seen": False, "comparison": {"how": "elementwise", "within": True, "max_abs": 0.0,
                                                  "max_rel": 0.0, "reference": "float64", "detail": None},
           "signal": None, "returncode": None, "duration": 0.5, "confirmed": None, "extra": {}, "v": 1}


@settings(max_examples=120, **BOUNDED)
@given(data=st.data())
def test_a_results_line_is_merged_typed_or_refused_with_exit_2(data):
    from opscan.bundle.results import load
    from opscan.probe.protocol import COMPARISON_TYPES, OUTCOME_TYPES
    from opscan.repro.issue import recorded_text

    outcome = copy.deepcopy(OUTCOME)
    field = data.draw(st.sampled_from([*OUTCOME_TYPES, *(f"comparison.{k}" for k in COMPARISON_TYPES)]))
    value = data.draw(VALUES)
    (outcome["comparison"] if field.startswith("comparison.") else outcome)[field.split(".")[-1]] = value
    environment = {"platform": data.draw(TEXT), "macos": data.draw(TEXT)}
    with tempfile.TemporaryDirectory() as tmp:
        path = _results_file(Path(tmp), outcome, environment)
        try:
            results = load(path, "b" * 64, [_Probe("p1")], "raised")
        except OpscanError as exc:  # exit 2, one line naming the file
            assert str(path) in str(exc) and "\n" not in str(exc).strip()
            return
    merged = results.outcomes[("p1", "off")]
    for name, types in OUTCOME_TYPES.items():
        got = getattr(merged, "pass_name" if name == "pass_name" else name)
        if name not in ("warnings", "comparison"):
            assert got is None and None in types or isinstance(got, tuple(t for t in types if t)), (name, got)
    text = recorded_text(merged.to_dict())
    assert isinstance(text, str)
    strict_loads(json.dumps(merged.to_dict(), allow_nan=False))


# --- a zoo manifest -------------------------------------------------------------------------------------------


@settings(max_examples=60, **BOUNDED)
@given(title=TEXT, name=TEXT, target=TEXT, key=TEXT, value=VALUES, error=TEXT)
def test_a_manifest_is_read_or_refused_and_its_leaderboard_keeps_its_formats(title, name, target, key, value,
                                                                              error):
    import csv

    from opscan.trust.read import Malformed, yaml_value
    from opscan.zoo import journal
    from opscan.zoo.board import ModelResult, make_board
    from opscan.zoo.html import render_html
    from opscan.zoo.models import ManifestError, parse_manifest
    from opscan.zoo.outputs import render_csv, render_json

    try:
        text = yaml.safe_dump({"title": title, "models": {name: {"target": target, "args": {key: value}}}})
    except (yaml.YAMLError, ValueError, OverflowError):
        return  # not something YAML writes
    try:
        models = parse_manifest(yaml_value(text), Path("zoo.yaml"))
    except (Malformed, ManifestError):
        return
    board = make_board(str(title), ("2.14.1",), [ModelResult(m, (), 1.0, error=error) for m in models])
    assert strict_loads(render_json(board))["models"][0]["model"]["name"] == models[0].name
    for row in csv.reader(io.StringIO(render_csv(board))):
        assert not any(cell[:1] in ("=", "+", "-", "@", "\t", "\r") for cell in row), row
    page = render_html(board)
    block = page.split('id="zoo-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block and no_command_lines(page)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / journal.JOURNAL_NAME
        path.write_text(journal.line(journal.header("zoo", ("2.14.1",))) +
                        "".join(journal.model_line(m.model.key, m.to_dict()) for m in board.models))
        done, _ = journal.read(path, ("2.14.1",))  # what opscan wrote, it reads back
        assert sorted(done) == sorted(m.model.key for m in board.models)


def test_the_properties_are_bounded_and_reproducible():
    """Every property here has an explicit budget and a fixed order of examples (see the module docstring)."""
    import sys

    for name, test in vars(sys.modules[__name__]).items():
        if name.startswith("test_") and hasattr(test, "hypothesis"):
            chosen = test._hypothesis_internal_use_settings
            assert chosen.derandomize and chosen.deadline is None and chosen.max_examples <= 150, name
