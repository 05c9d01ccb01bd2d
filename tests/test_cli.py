"""CLI tests: exit codes, one-line errors, what goes to stdout and what to stderr.

Every call goes through `opscan.cli.main([...])` in-process (capsys), except `--help` and
`python -m opscan`, which need a fresh interpreter. Targets live in tests/targets/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import opscan
from opscan.cli import main

from conftest import TARGETS

TINY = f"{TARGETS / 'tiny.py'}:build_model"
OPSCAN_PKG = str(Path(opscan.__file__).resolve().parent) + os.sep


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder, so a scan that forgets -o cannot write reports/ into the repo."""
    monkeypatch.chdir(tmp_path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """main(argv) -> (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return int(code), out, err


def assert_one_error_line(err: str, *fragments: str) -> str:
    """stderr holds exactly one 'opscan: error:' line, last, naming the problem and (after ' — ') the fix.

    Besides it, only opscan's own one-line progress messages may appear: no traceback.
    """
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("opscan: error:")]
    assert len(errors) == 1, err
    assert lines[-1] == errors[0], err
    assert all(line.startswith("opscan: ") for line in lines), err
    assert "Traceback" not in err
    assert " — " in errors[0], f"no fix named: {errors[0]}"
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


# --- exit code 2: one actionable line --------------------------------------------------------------


def test_missing_file(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'nope.py'}:build_model", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "nope.py", "does not exist", "check the path")


def test_missing_function(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'tiny.py'}:nope", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "no function 'nope'", "name a function that returns an nn.Module")


def test_target_not_callable(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'tiny.py'}:not_callable", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "'not_callable'", "not a function", "int")


def test_target_without_colon(capsys, tmp_path):
    code, out, err = run(capsys, str(TARGETS / "tiny.py"), "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "FILE.py:FUNCTION")


def test_missing_module(capsys, tmp_path):
    code, out, err = run(capsys, "opscan_no_such_package:build", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "cannot import module 'opscan_no_such_package'", "install it")


def test_factory_raises(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'tiny.py'}:raises", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "raised ValueError: width must be positive, got -1", "rerun with -v")


def test_factory_returns_non_module(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'tiny.py'}:not_a_module", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "returned dict, not an nn.Module", "(model, example_inputs)")


def test_inputs_that_do_not_fit(capsys, tmp_path):
    # Linear(4, 8) fed 7 features: the step fails in torch, which is the user's problem, not opscan's
    code, out, err = run(capsys, TINY, "--input", "3x7:float32", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "training step", "RuntimeError", "3x7", "check that the inputs fit the model")


def test_example_inputs_that_do_not_fit(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'wrong_shapes.py'}:build_model", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "RuntimeError", "3x7")


@pytest.mark.parametrize("text", ["3xA:float32", "3x4", "3x4:float99", "3x4:int64:9-2"])
def test_malformed_input(capsys, tmp_path, text):
    code, out, err = run(capsys, TINY, "--input", text, "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, f"--input {text!r}")


def test_malformed_arg(capsys, tmp_path):
    code, out, err = run(capsys, TINY, "--arg", "no_equals_sign", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "--arg 'no_equals_sign' is malformed", "KEY=VALUE")


def test_unwritable_output_dir(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = run(capsys, TINY, "-o", str(blocker / "reports"))
    assert code == 2 and out == ""
    assert_one_error_line(err, "cannot write reports to", "pass -o with a writable folder")


def test_syntax_error(capsys, tmp_path):
    code, out, err = run(capsys, f"{TARGETS / 'syntax_error.py'}:build_model", "-o", str(tmp_path))
    assert code == 2 and out == ""
    assert_one_error_line(err, "syntax_error.py:4: syntax error", "fix the file")


def test_missing_target_is_a_usage_error(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.splitlines()[-1].startswith("opscan: error:")


# --- -v: the user's traceback, not opscan's ----------------------------------------------------------


def test_verbose_factory_error_shows_user_traceback(capsys, tmp_path):
    code, _, err = run(capsys, f"{TARGETS / 'tiny.py'}:raises", "-v", "-o", str(tmp_path))
    assert code == 2
    assert err.count("opscan: error:") == 1
    assert "tiny.py\", line" in err and "in raises" in err and "in _make_layer" in err
    assert err.rstrip().endswith("ValueError: width must be positive, got -1")
    assert OPSCAN_PKG not in err, "opscan's own frames leaked into the user's traceback"


def test_verbose_step_error_hides_opscan_frames(capsys, tmp_path):
    code, _, err = run(capsys, TINY, "--input", "3x7:float32", "-v", "-o", str(tmp_path))
    assert code == 2
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in err
    assert OPSCAN_PKG not in err


# --- --fail-on ---------------------------------------------------------------------------------------

FLOAT64 = f"{TARGETS / 'tiny.py'}:with_float64"


@pytest.mark.parametrize(
    ("fail_on", "expected"),
    [
        # float64 has no MPS kernel for any op: predicted unsupported_dtype (rank 3), which ranks at or
        # above unknown (1) and unsupported_dtype (3). The same holds if a row were only `unknown`
        # (rank 1 >= 1), so the first case stays meaningful whatever the knowledge base decides.
        ("unknown", 1),
        ("unsupported_dtype", 1),
        # crash and timeout (rank 5) are measured-only verdicts: a predicted scan never reaches them
        ("crash", 0),
        (None, 0),  # without --fail-on, findings never fail
    ],
)
def test_fail_on(capsys, tmp_path, fail_on, expected):
    flags = ["--fail-on", fail_on] if fail_on else []
    code, out, _ = run(capsys, FLOAT64, *flags, "-f", "json", "-o", str(tmp_path))
    assert code == expected
    verdicts = {row["verdict"] for row in json.loads(out)["ops"]}
    assert "unsupported_dtype" in verdicts


# --- stdout is the artefact, stderr the chatter ------------------------------------------------------


def test_json_on_stdout_only(capsys, tmp_path):
    code, out, err = run(capsys, TINY, "-f", "json", "-o", str(tmp_path))
    assert code == 0
    report = json.loads(out)  # the whole of stdout is one JSON document
    assert report == json.loads((tmp_path / "report.json").read_text())
    assert yaml.safe_load((tmp_path / "report.yaml").read_text()) == report
    assert all(line.startswith("opscan: ") for line in err.splitlines()), err
    assert str(tmp_path / "report.json") in err  # says where the files went


def test_yaml_on_stdout(capsys, tmp_path):
    code, out, _ = run(capsys, TINY, "-f", "yaml", "-o", str(tmp_path))
    assert code == 0
    assert yaml.safe_load(out) == json.loads((tmp_path / "report.json").read_text())


def test_table_on_stdout(capsys, tmp_path):
    code, out, err = run(capsys, TINY, "-o", str(tmp_path))
    assert code == 0
    assert "Summary:" in out and "Lane (predicted):" in out
    assert "opscan: " not in out and "Summary:" not in err


def test_quiet_twice_silences_stderr(capsys, tmp_path):
    code, out, err = run(capsys, TINY, "-qq", "-f", "json", "-o", str(tmp_path))
    assert code == 0 and err == ""
    json.loads(out)


def test_format_from_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCAN_FORMAT", "json")
    code, out, _ = run(capsys, TINY, "-o", str(tmp_path))
    assert code == 0
    assert json.loads(out)["model"] == TINY


def test_default_output_dir_is_reports_model_name(capsys, tmp_path):
    code, _, _ = run(capsys, TINY, "-f", "json")  # cwd is tmp_path (see _in_tmp)
    assert code == 0
    assert (tmp_path / "reports" / "Sequential" / "report.json").is_file()


# --- fresh interpreters ------------------------------------------------------------------------------


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from opscan.cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert 'torch' not in sys.modules, 'opscan --help imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: opscan")


def test_every_subcommand_help_answers_without_torch():
    from opscan.cli import SUBCOMMANDS

    code = (
        "import sys\n"
        "from opscan.cli import main, SUBCOMMANDS\n"
        "for name in SUBCOMMANDS:\n"
        "    assert main([name, '--help']) == 0, name\n"
        "    assert 'torch' not in sys.modules, f'opscan {name} --help imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split()[2] for line in done.stdout.splitlines() if line.startswith("usage: opscan ")] == \
        list(SUBCOMMANDS)


def test_python_m_opscan_version():
    done = subprocess.run([sys.executable, "-m", "opscan", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"opscan {opscan.__version__}"


def test_internal_error_exits_3(tmp_path):
    """A bug in opscan (here one planted in the coverage table's builder by a sitecustomize the child process
    imports too) ends the real command line (`python -m opscan`: supervisor and child) with exit 3, the
    traceback and the "please report" line on stderr, and nothing on stdout."""
    (tmp_path / "sitecustomize.py").write_text(
        "import opscan.predict.coverage as c\n"
        "def _bug(*args, **kwargs):\n"
        "    raise ZeroDivisionError('planted bug')\n"
        "c.coverage = _bug\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(OPSCAN_PKG).parent)])}
    done = subprocess.run([sys.executable, "-m", "opscan", "coverage", "--torch-version", "2.5.0", "--no-since"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "ZeroDivisionError: planted bug" in lines
    assert lines[-1] == ("opscan: internal error — this is a bug in opscan; please report it with the traceback "
                         "above")


def test_inference_scans_the_forward_only(capsys, tmp_path):
    code, out, _ = run(capsys, TINY, "--inference", "-f", "json", "-o", str(tmp_path))
    assert code == 0
    report = json.loads(out)
    assert report["trace"]["step"] == "inference"
    assert set(report["phases"]) == {"forward"}


def test_reader_closing_stdout_early_is_not_an_error(tmp_path):
    # `opscan ... -f json | head -c 0`: the reader is gone before the report is printed
    cmd = [sys.executable, "-m", "opscan", TINY, "-f", "json", "-qq", "-o", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and err == ""
