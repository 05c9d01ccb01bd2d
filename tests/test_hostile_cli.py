"""Careless command lines: environment variables, numeric flags, parsing limits and malformed files, for every
subcommand — through `python -m opscan`, every promise checked (helpers_hostile.check). Most of these fail
before torch is imported, as they should: a bad value costs the user no trace.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers_hostile import TINY, check, opscan

FAST = ("--no-memory", "--no-fx")


# --- item 3: environment variables are read by their flag's rule, before any work ------------------------


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["coverage", "--help"], ["accept", "--help"]])
def test_help_and_version_work_whatever_the_environment_holds(argv):
    env = {"OPSCAN_MAX_ELEMENTS": "1e6", "OPSCAN_ITERATIONS": "1.5", "OPSCAN_FORMAT": "garbage",
           "OPSCAN_STEP_TIMEOUT": "-1", "OPSCAN_DEVICE": "tpu"}
    run = opscan(*argv, env=env)
    check(run, 0)
    assert run.out.startswith("usage: opscan") or run.out.startswith("opscan 0.")


@pytest.mark.parametrize("variable, value, words", [
    ("OPSCAN_MAX_ELEMENTS", "1e6", "'1e6' is not a whole number"),
    ("OPSCAN_ITERATIONS", "1.5", "'1.5' is not a whole number"),
    ("OPSCAN_FORMAT", "garbage", "is not one of table, json, yaml, html, junit"),
    ("OPSCAN_FAIL_ON", "bogus", "is not one of native, unknown"),
    ("OPSCAN_STEP_TIMEOUT", "nan", "nan is not a limit"),
    ("OPSCAN_DEVICE", "tpu", "is not one of cpu, cuda, mps"),
])
def test_a_bad_environment_variable_is_exit_2_naming_it(tmp_path, variable, value, words):
    # OPSCAN_FORMAT=garbage and OPSCAN_FAIL_ON=bogus used to run the whole scan, then exit 3
    run = opscan(TINY, "-o", str(tmp_path / "out"), env={"OPSCAN_FORMAT": "json", variable: value})
    check(run, 2, (f"{variable}={value!r}", words, f"fix or unset {variable}"), fmt="json")
    assert "tracing" not in run.err and not (tmp_path / "out").exists()  # before any work


def test_a_flag_given_wins_over_its_variable(tmp_path):
    run = opscan(TINY, "-o", str(tmp_path), "-f", "json", *FAST, env={"OPSCAN_FORMAT": "garbage"})
    check(run, 0, fmt="json", folders=[tmp_path])


@pytest.mark.parametrize("argv, env, words", [
    (["coverage", "--no-since"], {"OPSCAN_FORMAT": "html"}, "OPSCAN_FORMAT='html' is not one of table, json, yaml"),
    (["bundle", TINY, "--device", "cpu"], {"OPSCAN_MAX_ELEMENTS": "0"}, "OPSCAN_MAX_ELEMENTS='0': 0 is less than 1"),
    (["accept", TINY, "--device", "cpu"], {"OPSCAN_STEP_TIMEOUT": "0"}, "OPSCAN_STEP_TIMEOUT='0': 0 is not a limit"),
])
def test_the_subcommands_read_their_variables_the_same_way(tmp_path, argv, env, words):
    run = opscan(*argv, "-o" if argv[0] != "coverage" else "--op", str(tmp_path / "out") if argv[0] != "coverage"
                 else "relu", env=env)
    check(run, 2, words)


# --- item 11: numeric flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    ([TINY, "--workers", "-1"], "argument --workers: -1 is less than 1"),
    ([TINY, "--workers", "0"], "argument --workers: 0 is less than 1"),  # it used to mean the default
    ([TINY, "--probe-timeout", "0"], "argument --probe-timeout: 0 is not a limit"),  # every probe a timeout
    ([TINY, "--probe-timeout", "-5"], "argument --probe-timeout: -5 is not a limit"),
    ([TINY, "--probe-timeout", "nan"], "argument --probe-timeout: nan is not a limit"),  # exit 3 before
    ([TINY, "--max-elements", "0"], "argument --max-elements: 0 is less than 1"),  # it meant full shapes
    ([TINY, "--step-timeout", "inf"], "argument --step-timeout: inf is not a limit"),
    ([TINY, "--iterations", "2"], "argument --iterations: 2 is less than 3"),
    (["bundle", TINY, "--repro-timeout", "0"], "argument --repro-timeout: 0 is not a limit"),
    (["repro", "report.json", "aten::take", "--probe-timeout", "nan"], "argument --probe-timeout: nan is not a"),
    (["accept", TINY, "--iterations", "0"], "argument --iterations: 0 is less than 1"),
    (["accept", TINY, "--seed", str(2 ** 70)], "is out of range for a seed"),
    (["merge", "results.jsonl", "--step-timeout", "-1"], "argument --step-timeout: -1 is not a limit"),
])
def test_numeric_flags_are_checked(tmp_path, argv, words):
    run = opscan(*argv, cwd=tmp_path)
    check(run, 2, words)
    assert list(tmp_path.iterdir()) == []


def test_a_perturbation_that_is_not_a_finite_number_is_exit_2(tmp_path):
    run = opscan("accept", TINY, "--device", "cpu", "--perturb", "0.weight=nan", "-o", str(tmp_path / "pkg"))
    check(run, 2, ("--perturb 0.weight=nan", "is not a number"))
    assert not (tmp_path / "pkg").exists()


# --- item 13: parsing limits --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["--arg", "x=" + "+".join(["1"] * 50_000)], "nested too deeply"),  # RecursionError before
    (["--arg", "x=" + "-" * 100_000 + "1"], "nested too deeply"),  # MemoryError before
    (["--input", "2x4:int64:0-99999999999999999999999"], "for int64, LOW-HIGH must lie within"),  # overflow before
    (["--input", "2x4:uint8:0-257"], "for uint8, LOW-HIGH must lie within 0-256"),
    (["--input", "99999999999999999999x4:float32"], "is more than a tensor can hold"),
    (["--input", "1x" * 200 + "1:float32"], "is malformed"),  # a shape nobody means
])
def test_parsing_limits_are_usage_errors(tmp_path, argv, words):
    run = opscan(TINY, *argv, "-o", str(tmp_path / "out"), "-f", "json")
    check(run, 2, words, fmt="json")
    assert not (tmp_path / "out").exists()


# --- item 12: malformed files -------------------------------------------------------------------------------


@pytest.mark.parametrize("content, words", [
    ({"ops": [{"op": 5, "overload": "x", "dtypes": [], "verdict": "native"}]}, "ops[0] is not a row"),  # exit 3
    ({"ops": [{"op": "aten::relu", "overload": None, "dtypes": "float32", "verdict": "native"}]}, "ops[0] is not"),
    ({"ops": [5]}, "ops[0] is not a row"),
    ({"ops": 5}, "is not an opscan report.json"),
])
def test_a_malformed_baseline_is_exit_2_before_tracing(tmp_path, content, words):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(content))
    run = opscan(TINY, "--baseline", str(baseline), "-o", str(tmp_path / "out"), "-f", "junit")
    check(run, 2, (words, "the baseline"), fmt="junit")
    assert "tracing" not in run.err


def _report(findings) -> dict:
    """A report.json with a repro section holding these findings (what `opscan repro` reads)."""
    return {"model": "m.py:build", "repro": {"findings": findings, "command": "opscan m.py:build --repro"}}


FINDING = {"op": "aten::take", "dtypes": ["float32"], "calls": [{"probe": {}}]}


@pytest.mark.parametrize("findings, op, words", [
    ([5, "x"], "aten::take", "repro.findings[0] is a int, not an object"),
    ([{**FINDING, "op": "../../x::y"}], "../../x::y", "repro.findings[0] has no valid op name"),  # exit 3 before
    ([{**FINDING, "dtypes": 5}], "aten::take", "repro.findings[0] has no list of dtype names"),
    ([{**FINDING, "calls": [5]}], "aten::take", "has calls that are not call objects"),
    ([FINDING], "aten::take", "the repro section of aten::take is malformed"),  # the right shape, not a scan's
    ([FINDING], "../../etc::passwd", "has no finding in this report"),
])
def test_repro_of_a_malformed_report_is_exit_2(tmp_path, findings, op, words):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report(findings)))
    run = opscan("repro", str(report), op, "-o", str(tmp_path / "out"))
    check(run, 2, words)
    assert not (tmp_path / "out").exists()


# skipped where MPS is there (never on the command's own outcome: a regression to exit 0 must fail, not skip)
@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here: nothing to refuse")
def test_repro_minimize_on_a_missing_device_names_repros_own_fixes(tmp_path):
    # it used to suggest --no-probe, which repro does not have
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report([FINDING])))
    run = opscan("repro", str(report), "aten::take", "--minimize", "--device", "mps", "-o", str(tmp_path / "out"))
    check(run, 2, ("--minimize --device mps: mps is not available here", "--device cpu"))
    assert "--no-probe" not in run.err


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe binary", "corrupted"),
    (b'{"kind": "header"}\n', "corrupted"),
])
def test_merge_of_a_damaged_results_file_is_exit_2(tmp_path, content, words):
    bundle = tmp_path / "bundle"
    (bundle / "results").mkdir(parents=True)
    (bundle / "results" / "results.jsonl").write_bytes(content)
    (bundle / "manifest.json").write_text("{}")
    run = opscan("merge", str(bundle / "results" / "results.jsonl"), "-o", str(tmp_path / "out"), "-f", "json")
    check(run, 2, fmt="json")
    assert not (tmp_path / "out").exists()


def test_coverage_of_an_unknown_release_from_the_environment_is_exit_2():
    run = opscan("coverage", "--op", "relu", env={"OPSCAN_TORCH_VERSION": "9.9.9"})
    check(run, 2, ("no knowledge-base entry for torch 9.9.9", "predict for a covered release"), fix=False)
