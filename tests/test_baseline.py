"""`--baseline report.json`: fail only on rows new or worse than in an earlier report (matched by OpKey and
dtype signature, read with json only); its errors are usage errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from opscan.cli.read import load_baseline
from opscan.render.gate import failures
from opscan.cli import main
from opscan.errors import UsageError
from opscan.render import render_json

from conftest import TARGETS
from helpers_report import report

PAIR = f"{TARGETS / 'baseline_pair.py'}:build_model"


def write_baseline(tmp_path, rep) -> str:
    path = tmp_path / "baseline.json"
    path.write_text(render_json(rep))
    return str(path)


def test_same_rows_pass_and_fail_on_alone_still_fails(tmp_path):
    base = load_baseline(write_baseline(tmp_path, report()))
    assert failures(report().rows, None, base) == {}
    assert failures(report().rows, "cpu_fallback", base) == {}
    assert set(failures(report().rows, "cpu_fallback", None)) == {1, 2}


def test_new_rows_fail_from_unknown_up_by_default(tmp_path):
    smaller = report(rows=report().rows[:1])  # only the native convolution
    base = load_baseline(write_baseline(tmp_path, smaller))
    assert failures(report().rows, None, base) == {1: "new", 2: "new", 3: "new"}  # native linear is not
    assert failures(report().rows, "unsupported", base) == {2: "new"}


@pytest.mark.parametrize("content, what", [
    (None, "cannot read the baseline"), ("{not json", "is not an opscan report.json"),
    ('{"ops": [{"op": "aten::x"}]}', "is not an opscan report.json"),
])
def test_a_bad_baseline_is_a_usage_error(tmp_path, content, what):
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=what):
        load_baseline(path)


def test_cli_bad_baseline_exits_2_before_scanning(tmp_path, capsys):
    assert main([PAIR, "--baseline", str(tmp_path / "missing.json"), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opscan: error: cannot read the baseline") and "tracing" not in err


def test_cli_a_run_that_adds_an_unsupported_op_fails_one_that_does_not_passes(tmp_path, capsys):
    base = tmp_path / "base"
    assert main([PAIR, "--arg", "take=False", "-o", str(base), "-f", "json", "-q"]) == 0
    baseline = str(base / "report.json")
    capsys.readouterr()
    same = main([PAIR, "--arg", "take=False", "-o", str(tmp_path / "same"), "--baseline", baseline, "-q"])
    assert same == 0
    capsys.readouterr()
    added = main([PAIR, "--arg", "take=True", "-o", str(tmp_path / "added"), "--baseline", baseline, "-q",
                  "-f", "junit"])
    out, err = capsys.readouterr()
    assert added == 1
    assert "fails: aten::take [float32,int64] is unsupported (new)" in err
    suite = ET.fromstring(out).find("testsuite")  # the JUnit file agrees with the exit code
    assert int(suite.get("failures")) == err.count("fails: ") == 2  # take, and put_ (its backward)
    rows = json.loads((tmp_path / "added" / "report.json").read_text())["ops"]
    assert any(r["op"] == "aten::take" for r in rows)
