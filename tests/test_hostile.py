"""Hostile targets: code that ends the process, prints, loops, crashes, leaves threads and processes, changes
directory or forks — each run through the real command line (`python -m opscan`: the supervisor and its child),
each checked for every promise: exit code, stderr's last line, no traceback unless -v, stdout empty or whole in
its format, no partial file, no process left behind (helpers_hostile.check). The other files of the suite:
test_hostile_files.py (writes, folders, journals), test_hostile_cli.py (environment, flags, malformed files).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TARGETS
from helpers_hostile import KILL_LIMIT, check, opscan, target

FAST = ("--no-memory", "--no-fx")  # what these cases do not need: a smaller step to trace


# --- item 1: the target ends the process ------------------------------------------------------------------


@pytest.mark.parametrize("how, last", [
    ("sys_exit_0", "the target called sys.exit(0) in <lambda> (tests/targets/hostile.py:"),
    ("sys_exit_1", "the target called sys.exit(1) in <lambda> (tests/targets/hostile.py:"),
    ("os_exit_3", "the target called os._exit(3) in <lambda> (tests/targets/hostile.py:"),
    ("segfault", "the process died of SIGSEGV (segmentation fault) in _segfault (tests/targets/hostile.py:"),
    ("sigterm_self", "the process died of SIGTERM"),
    ("sigkill_self", "the process was killed (SIGKILL)"),
])
def test_a_target_that_ends_the_process_is_exit_2_naming_where(tmp_path, how, last):
    # sys.exit(0) used to pass a CI gate with no report, sys.exit(1) read as findings, os._exit(3) as a bug
    run = opscan(target(), "--arg", f"how={how!r}", "-o", str(tmp_path / "out"), "-f", "json", *FAST, cwd=REPO)
    check(run, 2, (last, "while running the training step of"), fmt="json", folders=[tmp_path / "out"])
    assert not (tmp_path / "out").exists()  # made for the run, left empty: removed


def test_sys_exit_in_the_factory_names_the_factory(tmp_path):
    run = opscan(target("factory_exits"), "-o", str(tmp_path / "out"), "-f", "json")
    check(run, 2, ("the target called sys.exit(0) in factory_exits", "while calling factory_exits()"), fmt="json")
    assert not (tmp_path / "out").exists()


def test_sys_exit_at_import_names_the_import(tmp_path):
    run = opscan(target(), "-o", str(tmp_path), "-f", "json", env={"HOSTILE_IMPORT": "exit"})
    check(run, 2, ("the target called sys.exit(4) in <module>", f"while importing {target().rpartition(':')[0]}"),
          fmt="json")


def test_verbose_shows_the_stack_after_the_line(tmp_path):
    run = opscan(target(), "--arg", "how='segfault'", "-o", str(tmp_path), "-v", *FAST)
    check(run, 2, verbose=True)
    lines = run.err.strip().splitlines()
    error = next(i for i, line in enumerate(lines) if line.startswith("opscan: error: the process died of SIGSEGV"))
    assert any("hostile.py" in line and "_segfault" in line for line in lines[error + 1:])  # the stack, after it


# --- item 2: the target prints ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "yaml", "junit"])
def test_prints_of_the_target_never_reach_stdout(tmp_path, fmt):
    # Python's print, a raw write to descriptor 1 and C's puts, at import, in the factory and in forward
    run = opscan(target(), "--arg", "how='prints'", "-o", str(tmp_path), "-f", fmt, *FAST)
    check(run, 0, "wrote", fmt=fmt, folders=[tmp_path])
    for line in ("PRINT-AT-IMPORT", "PRINT-IN-FORWARD", "FD1-IN-FORWARD", "LIBC-IN-FORWARD"):
        assert line not in run.out and line in run.err, line


def test_prints_in_the_factory_go_to_stderr(tmp_path):
    run = opscan(target("factory_prints"), "-o", str(tmp_path), "-f", "json", *FAST)
    check(run, 0, fmt="json", folders=[tmp_path])
    assert "PRINT-IN-FACTORY" in run.err and json.loads(run.out)["model"] == target("factory_prints")


# --- item 4: the user's own torch errors are theirs --------------------------------------------------------


@pytest.mark.parametrize("how, words", [
    ("inplace_leaf", "a leaf Variable that requires grad is being used in an in-place operation"),
    ("move_error", "RuntimeError"),  # raised inside .to("cpu", ...), which trace/moves.py wraps
])
def test_the_users_torch_errors_are_exit_2(tmp_path, how, words):
    run = opscan(target(), "--arg", f"how={how!r}", "-o", str(tmp_path), *FAST)
    check(run, 2, ("the training step of", words))


def test_a_scalar_input_into_a_linear_is_exit_2(tmp_path):
    run = opscan(target("linear_only"), "--input", "scalar:float32", "-o", str(tmp_path), *FAST)
    check(run, 2, ("the training step of", "both arguments to linear need to be at least 1D"))


def test_a_model_without_parameters_is_told_what_to_do(tmp_path):
    # AdamW([]) raised "empty parameter list" and the message said to check the inputs
    run = opscan(target("no_parameters"), "-o", str(tmp_path / "out"), *FAST)
    check(run, 2, ("no trainable parameters", "--inference"))
    assert "check that the inputs" not in run.last and not (tmp_path / "out").exists()


# --- item 5: a huge --input --------------------------------------------------------------------------------


def test_a_huge_input_switches_to_fake_tensors(tmp_path):
    # 2.5e9 x 4 float32 = 40e9 bytes = 37.3 GiB: over half of any RAM this runs on, so it is never allocated
    run = opscan(target("linear_only"), "--input", "2500000000x4:float32", "-o", str(tmp_path), "-f", "json", *FAST)
    check(run, 0, fmt="json", folders=[tmp_path])
    report = json.loads(run.out)
    assert report["trace"]["fake"] and "37.3 GiB of --input tensors" in report["trace"]["notes"][0]


def test_a_huge_input_with_no_fake_is_exit_2(tmp_path):
    # 1e12 x 4 float32 = 16e12 bytes = 14901.2 GiB: refused by the allocator, never half-allocated
    run = opscan(target("linear_only"), "--input", "1000000000000x4:float32", "--no-fake", "-o", str(tmp_path),
                 "-f", "json", *FAST)
    check(run, 2, ("the --input tensors (14901.2 GiB) cannot be allocated", "--fake"), fmt="json")


# --- item 7: hangs, threads and processes left behind ------------------------------------------------------


def test_a_factory_that_never_returns_is_stopped_at_the_step_limit(tmp_path):
    run = opscan(target("factory_hangs"), "-o", str(tmp_path / "out"), "--step-timeout", "5", "-f", "json")
    check(run, 2, ("calling factory_hangs()", "took longer than the step limit of 5 s",
                   "stopped in factory_hangs (", "hostile.py:"), fmt="json")
    assert not (tmp_path / "out").exists()


def test_an_import_that_never_returns_is_stopped_by_the_environment_limit(tmp_path):
    run = opscan(target(), "-o", str(tmp_path), env={"HOSTILE_IMPORT": "hang", "OPSCAN_STEP_TIMEOUT": "5"})
    check(run, 2, ("importing", "took longer than the step limit of 5 s", "stopped in <module> (", "hostile.py:"))


def test_a_thread_left_running_does_not_keep_opscan_alive(tmp_path):
    run = opscan(target("leaves_a_thread"), "-o", str(tmp_path), "-f", "json", *FAST)
    check(run, 0, "wrote", fmt="json", folders=[tmp_path])  # and no process left: the thread went with it


def test_a_process_left_running_is_killed(tmp_path):
    pid_file = tmp_path / "pid"
    run = opscan(target("leaves_a_process"), "-o", str(tmp_path / "out"), "-f", "json", *FAST,
                 env={"HOSTILE_PID_FILE": str(pid_file)})
    check(run, 0, "wrote", fmt="json", folders=[tmp_path / "out"])  # check() looks for the sleeping child too
    assert pid_file.read_text().strip().isdigit()


def test_a_fork_that_returns_into_opscan_does_not_scan_twice(tmp_path):
    run = opscan(target("forks_back"), "-o", str(tmp_path), "-f", "json", *FAST)
    check(run, 0, fmt="json", folders=[tmp_path])
    assert run.out.count('"schema_version"') == 1


def test_sigint_stops_the_run_and_removes_the_empty_folder(tmp_path):
    proc_out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSCAN_")}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "opscan", target("factory_hangs"), "-o", str(proc_out / "x"),
                             "--no-fake"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + KILL_LIMIT
    while not proc_out.exists() and time.monotonic() < deadline:  # the folder exists once the run checked it
        time.sleep(0.1)
    time.sleep(1.0)  # into the factory (a SIGINT before it is an interrupt all the same)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=KILL_LIMIT)
    assert proc.returncode == 2 and out == b""
    assert err.decode().strip().splitlines()[-1].startswith("opscan: error: interrupted")
    assert not proc_out.exists()  # created for the run, nothing written: removed


# --- item 10: a target that changes directory --------------------------------------------------------------


def test_a_relative_output_folder_stays_where_opscan_started(tmp_path):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    run = opscan(target("changes_directory"), "-o", "rel", *FAST, cwd=start, env={"HOSTILE_CHDIR": str(elsewhere)})
    check(run, 0, "report.json", folders=[start / "rel"])
    assert (start / "rel" / "report.json").is_file() and list(elsewhere.iterdir()) == []


def test_the_default_folder_stays_where_opscan_started(tmp_path):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    run = opscan(target("changes_directory"), *FAST, cwd=start, env={"HOSTILE_CHDIR": str(elsewhere)})
    check(run, 0, folders=[start / "reports"])
    assert (start / "reports" / "changes_directory" / "report.json").is_file() and list(elsewhere.iterdir()) == []


# --- item 14: torch's own log noise ------------------------------------------------------------------------


def test_torch_logs_stay_off_the_terminal_unless_verbose(tmp_path):
    # with --fake, the fake-tensor logger printed a 20-line "E... Traceback" block before opscan's line
    run = opscan(f"{TARGETS / 'wrong_shapes.py'}:build_model", "--fake", "-o", str(tmp_path))
    check(run, 2, ("the training step of", "a and b must have same reduction dim"))
    assert [line for line in run.err.splitlines() if not line.startswith("opscan: ")] == []
    loud = opscan(f"{TARGETS / 'wrong_shapes.py'}:build_model", "--fake", "-o", str(tmp_path), "-v")
    check(loud, 2, verbose=True)
    assert "fake_tensor.py" in loud.err  # -v: torch's logger speaks again


# --- item 15: the memory batch of a list of images ---------------------------------------------------------


def test_the_batch_of_a_list_of_images_is_the_list(tmp_path):
    # two 3 x 8 x 8 images: the batch is 2 (the list), not 3 (their channels); the sizing runs lengthen the list
    run = opscan(target("image_list"), "-o", str(tmp_path), "-f", "json", "--no-fx")
    check(run, 0, fmt="json", folders=[tmp_path])
    scaling = json.loads(run.out)["memory"]["batch_scaling"]
    assert scaling["batch"] == 2 and "list" in scaling["varied"]
    assert [p["batch"] for p in scaling["points"]] == [4, 6]  # the FACTORS 2 and 3 of memory/batch.py


# --- the subcommands with a hostile target -----------------------------------------------------------------


def test_bundle_with_a_target_that_exits(tmp_path):
    run = opscan("bundle", target(), "--arg", "how='sys_exit_0'", "--device", "cpu", "-o", str(tmp_path / "b"),
                 "--no-fx")
    check(run, 2, "the target called sys.exit(0) in <lambda>")
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.zip").exists()


def test_accept_with_a_target_that_exits(tmp_path):
    run = opscan("accept", target(), "--arg", "how='os_exit_3'", "--device", "cpu", "-o", str(tmp_path / "pkg"),
                 "-f", "json")
    check(run, 2, ("the target called os._exit(3)", "the acceptance run on cpu"), fmt="json")
    assert not (tmp_path / "pkg").exists()


def test_accept_names_the_iteration_and_device_of_a_failing_reference(tmp_path):
    run = opscan("accept", target("bad_dtype_reference"), "--device", "cpu", "--dtype", "bfloat16",
                 "-o", str(tmp_path / "pkg"), "-q")
    check(run, 2, ("the reference run failed: the step fails on cpu in iteration 1, forward",
                   "float32 is refused here"))
    assert not (tmp_path / "pkg").exists()  # the failing run leaves no empty package folder
