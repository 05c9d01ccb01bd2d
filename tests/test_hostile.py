"""Hostile targets: code that ends the process, prints, loops, crashes, leaves threads and processes, changes
directory or forks — each run through the real command line (`python -m opscan`: the supervisor and its child),
each checked for every promise: exit code, stderr's last line, no traceback unless -v, stdout empty or whole in
its format, no partial file, no process left behind (helpers_hostile.check). The runs are independent, so
they start together (helpers_hostile.run_all) and each test checks its own. The other files of the suite:
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
from helpers_hostile import KILL_LIMIT, check, run_all, target

FAST = ["--no-memory", "--no-fx"]  # what these cases do not need: a smaller step to trace
OUT = ["-o", "{dir}/out"]
ENDINGS = {  # how forward ends the process -> what stderr's last line says
    "sys_exit_0": "the target called sys.exit(0) in <lambda> (tests/targets/hostile.py:",
    "sys_exit_1": "the target called sys.exit(1) in <lambda> (tests/targets/hostile.py:",
    "os_exit_3": "the target called os._exit(3) in <lambda> (tests/targets/hostile.py:",
    "segfault": "the process died of SIGSEGV (segmentation fault) in _segfault (tests/targets/hostile.py:",
    "sigterm_self": "the process died of SIGTERM",
    "sigkill_self": "the process was killed (SIGKILL)",
}
WRONG_SHAPES = f"{TARGETS / 'wrong_shapes.py'}:build_model"


def _chdir_setup(folder):
    (folder / "elsewhere").mkdir()


CASES = {
    **{how: {"argv": [target(), "--arg", f"how={how!r}", *OUT, "-f", "json", *FAST]} for how in ENDINGS},
    "factory_exits": {"argv": [target("factory_exits"), *OUT, "-f", "json"]},
    "import_exits": {"argv": [target(), *OUT, "-f", "json"], "env": {"HOSTILE_IMPORT": "exit"}},
    "verbose_segfault": {"argv": [target(), "--arg", "how='segfault'", *OUT, "-v", *FAST]},
    "prints": {"argv": [target(), "--arg", "how='prints'", *OUT, "-f", "json", *FAST]},
    "inplace_leaf": {"argv": [target(), "--arg", "how='inplace_leaf'", *OUT, *FAST]},
    "move_error": {"argv": [target(), "--arg", "how='move_error'", *OUT, *FAST]},
    "scalar": {"argv": [target("linear_only"), "--input", "scalar:float32", *OUT, *FAST]},
    "no_parameters": {"argv": [target("no_parameters"), *OUT, *FAST]},
    "huge_fake": {"argv": [target("linear_only"), "--input", "2500000000x4:float32", *OUT, "-f", "json", *FAST]},
    "huge_real": {"argv": [target("linear_only"), "--input", "1000000000000x4:float32", "--no-fake", *OUT, "-f",
                           "json", *FAST]},
    "factory_hangs": {"argv": [target("factory_hangs"), *OUT, "--step-timeout", "5", "-f", "json"]},
    "import_hangs": {"argv": [target(), *OUT], "env": {"HOSTILE_IMPORT": "hang", "OPSCAN_STEP_TIMEOUT": "5"}},
    "thread": {"argv": [target("leaves_a_thread"), *OUT, "-f", "yaml", *FAST]},
    "process": {"argv": [target("leaves_a_process"), *OUT, "-f", "junit", *FAST],
                "env": {"HOSTILE_PID_FILE": "{dir}/pid"}},
    "fork": {"argv": [target("forks_back"), *OUT, "-f", "json", *FAST]},
    "chdir_relative": {"argv": [target("changes_directory"), "-o", "rel", *FAST], "cwd": True,
                       "env": {"HOSTILE_CHDIR": "{dir}/elsewhere"}, "setup": _chdir_setup},
    "chdir_default": {"argv": [target("changes_directory"), *FAST], "cwd": True,
                      "env": {"HOSTILE_CHDIR": "{dir}/elsewhere"}, "setup": _chdir_setup},
    "torch_logs": {"argv": [WRONG_SHAPES, "--fake", *OUT]},
    "torch_logs_verbose": {"argv": [WRONG_SHAPES, "--fake", *OUT, "-v"]},
    "image_list": {"argv": [target("image_list"), *OUT, "-f", "json", "--no-fx"]},
    "bundle_exits": {"argv": ["bundle", target(), "--arg", "how='sys_exit_0'", "--device", "cpu", "-o", "{dir}/b",
                              "--no-fx"]},
    "accept_exits": {"argv": ["accept", target(), "--arg", "how='os_exit_3'", "--device", "cpu", "-o", "{dir}/pkg",
                              "-f", "json"]},
    "accept_reference": {"argv": ["accept", target("bad_dtype_reference"), "--device", "cpu", "--dtype", "bfloat16",
                                  "-o", "{dir}/pkg", "-q"]},
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every case of CASES, run at once: name -> (Run, the case's folder)."""
    return run_all(CASES, tmp_path_factory.mktemp("hostile"))


# --- item 1: the target ends the process ------------------------------------------------------------------


@pytest.mark.parametrize("how", ENDINGS)
def test_a_target_that_ends_the_process_is_exit_2_naming_where(ran, how):
    # sys.exit(0) used to pass a CI gate with no report, sys.exit(1) read as findings, os._exit(3) as a bug
    run, folder = ran[how]
    check(run, 2, (ENDINGS[how], "while running the training step of"), fmt="json", folders=[folder / "out"])
    assert not (folder / "out").exists()  # made for the run, left empty: removed


def test_sys_exit_in_the_factory_names_the_factory(ran):
    run, folder = ran["factory_exits"]
    check(run, 2, ("the target called sys.exit(0) in factory_exits", "while calling factory_exits()"), fmt="json")
    assert not (folder / "out").exists()


def test_sys_exit_at_import_names_the_import(ran):
    run, _ = ran["import_exits"]
    check(run, 2, ("the target called sys.exit(4) in <module>", f"while importing {target().rpartition(':')[0]}"),
          fmt="json")


def test_verbose_shows_the_stack_after_the_line(ran):
    run, _ = ran["verbose_segfault"]
    check(run, 2, "the process died of SIGSEGV", verbose=True)
    lines = run.err.strip().splitlines()
    error = lines.index(run.error)
    assert any("hostile.py" in line and "_segfault" in line for line in lines[error + 1:])  # the stack, after it


# --- item 2: the target prints ----------------------------------------------------------------------------


def test_prints_of_the_target_never_reach_stdout(ran):
    # Python's print, a raw write to descriptor 1 and C's puts in forward, and a print at import
    run, folder = ran["prints"]
    check(run, 0, "wrote", fmt="json", folders=[folder / "out"])
    for line in ("PRINT-AT-IMPORT", "PRINT-IN-FORWARD", "FD1-IN-FORWARD", "LIBC-IN-FORWARD"):
        assert line not in run.out and line in run.err, line


@pytest.mark.parametrize("name, fmt", [("thread", "yaml"), ("process", "junit")])
def test_yaml_and_junit_stay_whole_beside_prints(ran, name, fmt):
    run, folder = ran[name]  # hostile.py prints at import and in these factories
    check(run, 0, "wrote", fmt=fmt, folders=[folder / "out"])
    assert "PRINT-AT-IMPORT" in run.err and "PRINT-IN-FACTORY" in run.err and "PRINT" not in run.out


# --- item 4: the user's own torch errors are theirs --------------------------------------------------------


@pytest.mark.parametrize("name, words", [
    ("inplace_leaf", "a leaf Variable that requires grad is being used in an in-place operation"),
    ("move_error", "RuntimeError"),  # raised inside .to("cpu", ...), which trace/moves.py wraps
    ("scalar", "both arguments to linear need to be at least 1D"),  # --input scalar:float32 into a Linear
])
def test_the_users_torch_errors_are_exit_2(ran, name, words):
    run, _ = ran[name]
    check(run, 2, ("the training step of", words))


def test_a_model_without_parameters_is_told_what_to_do(ran):
    # AdamW([]) raised "empty parameter list" and the message said to check the inputs
    run, folder = ran["no_parameters"]
    check(run, 2, ("no trainable parameters", "--inference"))
    assert "check that the inputs" not in run.last and not (folder / "out").exists()


# --- item 5: a huge --input --------------------------------------------------------------------------------


def test_a_huge_input_switches_to_fake_tensors(ran):
    # 2.5e9 x 4 float32 = 40e9 bytes = 37.3 GB (2**30 B, opscan/units.py): over half of any RAM this runs on
    run, folder = ran["huge_fake"]
    check(run, 0, fmt="json", folders=[folder / "out"])
    report = json.loads(run.out)
    assert report["trace"]["fake"] and "37.3 GB of --input tensors" in report["trace"]["notes"][0]


def test_a_huge_input_with_no_fake_is_exit_2(ran):
    # 1e12 x 4 float32 = 16e12 bytes = 14901.2 GB (2**30 B): refused by the allocator, never half-allocated
    run, _ = ran["huge_real"]
    check(run, 2, ("the --input tensors (14901.2 GB) cannot be allocated", "--fake"), fmt="json")


# --- item 7: hangs, threads and processes left behind ------------------------------------------------------


def test_a_factory_that_never_returns_is_stopped_at_the_step_limit(ran):
    run, folder = ran["factory_hangs"]
    check(run, 2, ("calling factory_hangs()", "took longer than the step limit of 5 s",
                   "stopped in factory_hangs (tests/targets/hostile.py:"), fmt="json")
    assert not (folder / "out").exists()


def test_an_import_that_never_returns_is_stopped_by_the_environment_limit(ran):
    run, _ = ran["import_hangs"]
    check(run, 2, ("importing", "took longer than the step limit of 5 s",
                   "stopped in <module> (tests/targets/hostile.py:"))


def test_a_thread_left_running_does_not_keep_opscan_alive(ran):
    run, folder = ran["thread"]  # the thread sleeps for an hour; the kill limit would catch a wait for it
    check(run, 0, "wrote", fmt="yaml", folders=[folder / "out"])


def test_a_process_left_running_is_killed(ran):
    run, folder = ran["process"]
    check(run, 0, "wrote", fmt="junit", folders=[folder / "out"])  # check() looks for the sleeping child too
    assert (folder / "pid").read_text().strip().isdigit()


def test_a_fork_that_returns_into_opscan_does_not_scan_twice(ran):
    run, folder = ran["fork"]
    check(run, 0, fmt="json", folders=[folder / "out"])
    assert run.out.count('"schema_version"') == 1


def test_sigint_stops_the_run_and_removes_the_empty_folder(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSCAN_")}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "opscan", target("factory_hangs"), "-o", str(out / "x"),
                             "--no-fake"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + KILL_LIMIT
    while not out.exists() and time.monotonic() < deadline:  # the folder exists once the run checked it
        time.sleep(0.1)
    time.sleep(1.0)  # on into torch's import or the factory: an interrupt either way
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=KILL_LIMIT)
    assert proc.returncode == 2 and stdout == b""
    last = stderr.decode().strip().splitlines()[-1]
    assert last.startswith("opscan: error: interrupted") and "Traceback" not in stderr.decode()
    assert not out.exists()  # created for the run, nothing written: removed


# --- item 10: a target that changes directory --------------------------------------------------------------


@pytest.mark.parametrize("name, where", [("chdir_relative", "rel"), ("chdir_default", "reports/changes_directory")])
def test_output_stays_where_opscan_started(ran, name, where):
    run, folder = ran[name]
    check(run, 0, "report.json", folders=[folder / where])
    assert (folder / where / "report.json").is_file() and list((folder / "elsewhere").iterdir()) == []


# --- item 14: torch's own log noise ------------------------------------------------------------------------


def test_torch_logs_stay_off_the_terminal_unless_verbose(ran):
    # with --fake, the fake-tensor logger printed a 20-line "E... Traceback" block before opscan's line
    run, _ = ran["torch_logs"]
    check(run, 2, ("the training step of", "a and b must have same reduction dim"))
    assert [line for line in run.err.splitlines() if not line.startswith("opscan: ")] == []
    loud, _ = ran["torch_logs_verbose"]
    check(loud, 2, "a and b must have same reduction dim", verbose=True)
    assert "fake_tensor.py" in loud.err  # -v: torch's logger speaks again


# --- item 15: the memory batch of a list of images ---------------------------------------------------------


def test_the_batch_of_a_list_of_images_is_the_list(ran):
    # two 3 x 8 x 8 images: the batch is 2 (the list), not 3 (their channels); the sizing runs lengthen the list
    run, folder = ran["image_list"]
    check(run, 0, fmt="json", folders=[folder / "out"])
    scaling = json.loads(run.out)["memory"]["batch_scaling"]
    assert scaling["batch"] == 2 and "list" in scaling["varied"]
    assert [p["batch"] for p in scaling["points"]] == [4, 6]  # the FACTORS 2 and 3 of memory/batch.py


@pytest.mark.parametrize("inputs, batch", [
    (lambda t: ([t.rand(3, 8, 8), t.rand(3, 8, 8)],), 2),  # C x H x W images in a list: the list (not 3)
    (lambda t: {"ids": [t.arange(4), t.arange(6), t.arange(2)]}, 3),  # 1-d sequences in a list: the list
    (lambda t: ([t.rand(2, 4, 8, 8), t.rand(2, 4, 4, 4)],), 2),  # batched feature maps: their leading dimension
    (lambda t: ([t.rand(3, 8), t.rand(3, 8)],), 3),  # rank 2 may be batched: the leading dimension, as before
    (lambda t: (t.rand(5, 3), t.rand(5)), 5),  # plain tensors: the leading dimension most of them share
])
def test_the_batch_guess(inputs, batch):
    import torch

    from opscan.memory.batch import batch_of

    assert batch_of(inputs(torch)) == batch


# --- the subcommands with a hostile target -----------------------------------------------------------------


def test_bundle_with_a_target_that_exits(ran):
    run, folder = ran["bundle_exits"]
    check(run, 2, "the target called sys.exit(0) in <lambda>")
    assert not (folder / "b").exists() and not (folder / "b.zip").exists()


def test_accept_with_a_target_that_exits(ran):
    run, folder = ran["accept_exits"]
    check(run, 2, ("the target called os._exit(3)", "the acceptance run on cpu"), fmt="json")
    assert not (folder / "pkg").exists()


def test_accept_names_the_iteration_and_device_of_a_failing_reference(ran):
    run, folder = ran["accept_reference"]
    check(run, 2, ("the reference run failed: the step fails on cpu in iteration 1, forward",
                   "float32 is refused here"))
    assert not (folder / "pkg").exists()  # the failing run leaves no empty package folder
