"""CLI layer: why a supervised child ended — the exit code and, for an end it did not announce, the one line.

The supervisor (supervisor.py) hands over what it watched: the stage of the target's code that ran, the
messages the child sent (its exit code, an `os._exit` the target called), whether the supervisor stopped a
stage over its limit or passed on an interrupt, the return code and the faulthandler dump. An end the child
did not announce while the target's code ran is the target's doing (exit 2); with no stage running it is a bug
in opscan or torch (exit 3, with the stacks). No torch here.
"""

from __future__ import annotations

import signal
import sys

from opscan.errors import ExitCode
from opscan.target.user_code import where_in_dump

RERUN = "the run stopped there: rerun it (a measured run continues with --resume)"


def outcome(watch, returncode: int, dump: str) -> int:
    """The exit code, and the one line that explains an end the child did not announce."""
    if watch.timed_out is None and watch.exit is not None and returncode == watch.exit:
        return returncode
    code, line = _explain(watch, returncode, dump)
    if code == ExitCode.INTERNAL and dump.strip():
        print(dump.rstrip("\n"), file=sys.stderr)
    print(f"opscan: error: {line}" if code != ExitCode.INTERNAL else f"opscan: internal error: {line}",
          file=sys.stderr, flush=True)
    if code != ExitCode.INTERNAL and watch.verbose and dump.strip():  # -v: the stacks, after the line (as a
        print(dump.rstrip("\n"), file=sys.stderr, flush=True)        # user traceback comes after it)
    return code


def _explain(watch, returncode: int, dump: str) -> tuple[int, str]:
    """(exit code, message) for an end the child did not announce."""
    stage = watch.timed_out or watch.stage
    during = f" while {stage}" if stage else ""
    if watch.timed_out is not None:
        where = where_in_dump(dump, main_thread=True)
        return ExitCode.USAGE, (f"{watch.timed_out} took longer than the step limit of {watch.limit:g} s; stopped"
                                f"{where} — the target's code may never return: fix it, or raise --step-timeout "
                                "(OPSCAN_STEP_TIMEOUT) if it is only slow")
    if watch.signalled is not None:
        return ExitCode.USAGE, f"interrupted ({signal.Signals(watch.signalled).name}){during} — {RERUN}"
    if watch.os_exit is not None:
        return ExitCode.USAGE, (f"the target called os._exit({watch.os_exit['os_exit']}){watch.os_exit['where']}"
                                f"{during} — a scanned target must return, not end the process: remove the call")
    return _died(returncode, stage, dump)


def _died(returncode: int, stage: str | None, dump: str) -> tuple[int, str]:
    """A child that ended without saying so: the target's doing when its code was running."""
    during = f" while {stage}" if stage else ""
    if returncode < 0:
        name = _signal_name(-returncode)
        if -returncode == signal.SIGKILL:
            return ExitCode.USAGE, (f"the process was killed (SIGKILL){during} — out of memory, or killed by "
                                    "someone: check free memory (--fake traces without allocating)")
        what = f"the process died of {name}{where_in_dump(dump, main_thread=False)}{during}"
    else:
        what = f"the process ended with exit status {returncode}{during} (exit() from C, or a library's abort)"
    if stage is None:
        return ExitCode.INTERNAL, f"{what} — no code of the target was running: this is a bug in opscan or torch; " \
                                  "please report it with the stack above"
    return ExitCode.USAGE, f"{what} — the target's code ended the process: rerun with -v for the stack, fix it"


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGBUS": "bus error", "SIGFPE": "arithmetic"}
    return f"{name} ({meaning[name]})" if name in meaning else name
