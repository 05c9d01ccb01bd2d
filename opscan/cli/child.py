"""CLI layer, the supervised side: the command as it runs in the child the supervisor started (supervisor.py).

The child runs the ordinary in-process CLI (`opscan.cli.dispatch.run(argv)`) and tells the supervisor, one JSON line
at a time on the control pipe, what the supervisor cannot see from outside: the command's `--step-timeout`
and `-v`, each stage of the target's code as it begins and ends (target/user_code.py), each output folder it
creates, an `os._exit()` called by the target (with its caller's line), and the exit code it is about to
end with. It ends with `os._exit` once its output is flushed, so threads the target left running never
keep opscan alive. A fault (SIGSEGV, SIGABRT, ...) and SIGUSR1 (the supervisor's "where are you?" before it
stops a stage over its limit) dump the Python stacks into the file the supervisor reads. No torch here.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading

ENV = "OPSCAN_SUPERVISED"  # "CTL,LIFELINE,DUMP,STDOUT_CLOSED": the descriptors the supervisor passed
PATH_ENV = "OPSCAN_SUPERVISED_PATH"  # the supervisor's sys.path (JSON), so the child imports what it would
BOOT = ("import json, os, sys; sys.path[:] = json.loads(os.environ.pop('OPSCAN_SUPERVISED_PATH')); "
        "import opscan.cli.child as c; c.main()")  # the child's -c program: the supervisor's sys.path, then main()
_REAL_EXIT = os._exit


class Channel:
    """JSON lines to the supervisor; writes of the child's own process only (never a fork's)."""

    def __init__(self, fd: int):
        self.fd, self.pid = fd, os.getpid()

    def send(self, **message) -> None:
        """One message (one write, atomic below PIPE_BUF for the short messages sent)."""
        if os.getpid() != self.pid:
            return
        try:
            os.write(self.fd, (json.dumps(message) + "\n").encode())
        except OSError:
            pass  # the supervisor is gone: the lifeline ends this process


def main() -> None:
    """Run `opscan ARGV` (sys.argv[1:]) under the supervisor; never returns."""
    ctl, lifeline, dump, stdout_closed = (int(x) for x in os.environ.pop(ENV).split(","))
    channel = Channel(ctl)
    _watch_lifeline(lifeline)
    dump_file = os.fdopen(dump, "w")
    faulthandler.enable(file=dump_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True, chain=False)
    from opscan.target.run import RunContext

    ctx = RunContext(on_stage=lambda stage: channel.send(stage=stage), on_folder=lambda p: channel.send(dir=p),
                     on_config=lambda **c: channel.send(config=c))
    _report_os_exit(channel, ctx)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the supervisor forwards interrupts on purpose, even
    # when opscan itself was started with SIGINT ignored (a background job of a script)
    if stdout_closed:
        sys.stdout = None  # the artefact has nowhere to go: emit() says so (exit 2)
    from opscan.cli.dispatch import run

    try:
        code = int(run(sys.argv[1:], ctx))
    except BaseException:  # noqa: BLE001 - run_guarded maps everything; this is the last resort
        import traceback

        traceback.print_exc()
        code = 3
    _end(channel, code)


def _end(channel: Channel, code: int) -> None:
    """Flush what is buffered, tell the supervisor the exit code, and end now (whatever threads remain)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    channel.send(exit=code)
    _REAL_EXIT(code)


def _watch_lifeline(fd: int) -> None:
    """End this process group when the supervisor dies (its end of the lifeline closes)."""
    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="opscan-lifeline", daemon=True).start()


def _report_os_exit(channel: Channel, ctx) -> None:
    """os._exit called by the target is reported, with its caller's line and the run's stage, before the process
    ends."""
    def _exit(code: int) -> None:
        from opscan.target import user_code

        where = user_code.user_frame(user_code.frames_of(sys._getframe(1)))
        channel.send(os_exit=code, where=where, stage=ctx.current())
        _REAL_EXIT(code)

    os._exit = _exit
