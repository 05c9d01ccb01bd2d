"""Exit 3, the documented "internal error", through the real command line (`python -m opscan`: the supervisor
and its child): a bug in opscan itself ends the run with the stack it happened in, one "please report" line and
exit 3 — never exit 2 ("your target's fault"), never exit 0 or 1, never a partial artefact on stdout.

The bug is planted by a crafted target (tests/targets/internal_bug.py): its factory replaces opscan's own
`Report.to_dict` with a broken one, so the failure happens in opscan after the target's code has returned — with
no stage of the target running, as a real bug of opscan would. Two endings: a plain exception (the child's
run_guarded maps it: traceback, "please report", exit 3, announced to the supervisor) and the process dying of a
signal with no stage running (the supervisor's reading, cli/endings.py: the faulthandler stacks, "please report",
exit 3).
"""

from __future__ import annotations

from conftest import TARGETS
from helpers_hostile import check, opscan

BUGGY = TARGETS / "internal_bug.py"
BUG = "RuntimeError: simulated bug inside opscan (tests/targets/internal_bug.py replaced Report.to_dict)"
REPORT_IT = "opscan: internal error — this is a bug in opscan; please report it with the traceback above"
ARGS = ("-f", "json", "--no-probe", "--no-memory", "--no-fx")
ABORT_LINE = next(n for n, line in enumerate(BUGGY.read_text().splitlines(), 1) if "os.abort()" in line)


def test_internal_error_exits_3(tmp_path):
    run = opscan(f"{BUGGY}:raises", *ARGS, "-o", str(tmp_path / "out"), cwd=tmp_path)
    check(run, 3, verbose=True, folders=[tmp_path / "out"])  # stdout empty, nothing partial, nothing left running
    lines = run.err.strip().splitlines()
    assert lines[-1] == REPORT_IT, run.err
    assert lines[-2] == BUG, run.err  # the traceback above it ends with the bug itself ...
    trace = run.err[run.err.index("Traceback (most recent call last):"):]
    assert 'opscan/render/structured.py", line' in trace and "in render_json" in trace, trace  # ... in opscan's code
    assert "opscan: error:" not in run.err  # not presented as the user's mistake
    assert not (tmp_path / "out" / "report.json").exists()  # the reports are written whole, or not at all


def test_a_crash_with_no_code_of_the_target_running_exits_3(tmp_path):
    run = opscan(f"{BUGGY}:aborts", *ARGS, "-o", str(tmp_path / "out"), cwd=tmp_path)
    check(run, 3, verbose=True, folders=[tmp_path / "out"])
    lines = run.err.strip().splitlines()
    assert lines[-1] == (f"opscan: internal error: the process died of SIGABRT (abort) in _abort ({BUGGY}:{ABORT_LINE})"
                         " — no code of the target was running: this is a bug in opscan or torch; please report it "
                         "with the stack above"), run.err
    stacks = run.err[run.err.index("Fatal Python error: Aborted"):]
    assert 'opscan/render/structured.py", line' in stacks and "in render_json" in stacks, stacks  # the stack shown
    assert "opscan: error:" not in run.err
