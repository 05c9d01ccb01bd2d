"""CLI layer: the thin supervisor `opscan` runs as, started before torch is imported.

opscan runs other people's code, which may end the process (`os._exit`, a segfault, a signal), loop forever,
or leave threads and processes behind. So the command line runs each command in a child (child.py: the
ordinary in-process CLI) in a session of its own, stdin from /dev/null, and this process only watches it:

- the child's own exit code passes through; an end it did not announce is the target's (`os._exit(3)` in
  forward, SIGSEGV in the factory, SIGKILL: out of memory?): exit 2, one line naming the call, its line and
  the stage (exit 3 only when none of the target's code was running);
- a stage of the target's code running past `--step-timeout` is stopped (its stack dumped first: where it
  was), the child's process group killed: exit 2; SIGINT/SIGTERM/SIGHUP go to the child (a second one, or
  GRACE seconds later: SIGKILL): exit 2;
- when the child ends, what is left in its process group is killed, and the output folders it created and
  left empty are removed.

`opscan.cli.main(list)` (tests, Python callers) runs in-process, without all this. No torch here.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from opscan.cli.child import BOOT, ENV, PATH_ENV
from opscan.cli.files import is_open, remove_if_empty
from opscan.cli.endings import RERUN, outcome
from opscan.errors import ExitCode

GRACE = 10.0  # seconds a signalled child gets to end by itself before SIGKILL
POLL = 0.5  # seconds between checks of a child that closed no pipe
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Watch:
    """What the child said so far, and what happened to it."""

    limit: float | None = None
    verbose: int = 0
    stage: str | None = None
    since: float = 0.0
    exit: int | None = None
    os_exit: dict | None = None
    dirs: list = field(default_factory=list)
    timed_out: str | None = None
    signalled: int | None = None  # the signal forwarded to the child (interrupt)
    kill_at: float | None = None
    buffer: bytes = b""

    def feed(self, data: bytes) -> None:
        """Take the JSON lines in `data` (a message may be split across reads; a line that is not one is
        dropped: only the child writes there, but the target runs in it)."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                self.take(message)

    def take(self, message: dict) -> None:
        """One message from the child."""
        if "config" in message:
            self.limit, self.verbose = message["config"].get("limit"), message["config"].get("verbose", 0)
        if "stage" in message:
            self.stage, self.since = message["stage"], time.monotonic()
        if "dir" in message:
            self.dirs.append(message["dir"])
        if "os_exit" in message:
            self.os_exit = message
        if "exit" in message:
            self.exit = message["exit"]

    def overdue(self, now: float) -> bool:
        """True when a stage of the target's code has run past the limit."""
        return self.stage is not None and self.limit is not None and now - self.since > self.limit

    def wait(self, now: float) -> float:
        """Seconds to wait for the next message before checking the clock again."""
        due = [POLL]
        if self.stage is not None and self.limit is not None:
            due.append(self.since + self.limit - now)
        if self.kill_at is not None:
            due.append(self.kill_at - now)
        return max(0.0, min(due))


def supervise(argv: list[str]) -> int:
    """Run `opscan ARGV` in a supervised child; the exit code."""
    try:
        return _supervise(argv)
    except KeyboardInterrupt:
        print(f"opscan: error: interrupted — {RERUN}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception:  # noqa: BLE001 - the supervisor's own failure is opscan's bug
        import traceback

        traceback.print_exc()
        print("opscan: internal error — this is a bug in opscan; please report it with the traceback above",
              file=sys.stderr)
        return ExitCode.INTERNAL


def _supervise(argv: list[str]) -> int:
    dump = _dump_file()
    ctl_r, ctl_w = (_high(fd) for fd in os.pipe())
    life_r, life_w = (_high(fd) for fd in os.pipe())
    child = _start(argv, ctl_w, life_r, dump)
    for fd in (ctl_w, life_r):
        os.close(fd)
    watch = Watch()
    with Forwarding(child, watch):
        _follow(child, ctl_r, watch, dump)
    _kill_group(child.pid)  # what the target left behind
    code = outcome(watch, child.returncode, _read_all(dump))
    for path in sorted(watch.dirs, key=len, reverse=True):  # the folders it made and left empty, deepest first
        remove_if_empty(path)
    for fd in (ctl_r, life_w, dump):
        os.close(fd)
    return code


def _dump_file() -> int:
    """An unnamed temporary file for the child's faulthandler dumps."""
    fd, path = tempfile.mkstemp(prefix="opscan-stacks-")
    os.unlink(path)
    return _high(fd)


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _start(argv: list[str], ctl: int, lifeline: int, dump: int) -> subprocess.Popen:
    """The child: this interpreter, this sys.path, a session of its own, stdin from /dev/null."""
    closed = not is_open(1)
    env = {**os.environ, ENV: f"{ctl},{lifeline},{dump},{int(closed)}", PATH_ENV: json.dumps(sys.path)}
    flags = subprocess._args_from_interpreter_flags()  # -X, -W, -I ... as this interpreter was started
    return subprocess.Popen([sys.executable, *flags, "-c", BOOT, *argv], env=env, pass_fds=(ctl, lifeline, dump),  # noqa: S603 - this interpreter, opscan's own boot code; argv is the user's
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL if closed else None,
                            stderr=None if is_open(2) else subprocess.DEVNULL, start_new_session=True)


def _follow(child: subprocess.Popen, ctl: int, watch: Watch, dump: int) -> None:
    """Read the child's messages until it ends; stop a stage over its limit; kill a child signalled too long ago."""
    open_ = True
    while True:
        now = time.monotonic()
        if watch.overdue(now):
            watch.timed_out = watch.stage
            _stop(child, dump)
            return
        if watch.kill_at is not None and now >= watch.kill_at:
            _kill_group(child.pid)
        ready = select.select([ctl], [], [], watch.wait(now))[0] if open_ else _wait(child, watch.wait(now))
        data = os.read(ctl, 65536) if ready and open_ else b""
        open_ = open_ and not (ready and not data)  # end of file: the child closed it (or ended)
        if data:
            watch.feed(data)
        elif child.poll() is not None:
            if open_:
                _drain(ctl, watch)
            return


def _wait(child: subprocess.Popen, timeout: float) -> list:
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    return []


def _drain(ctl: int, watch: Watch) -> None:
    """The messages still in the pipe after the child ended (a fork of it may hold the pipe open)."""
    while select.select([ctl], [], [], 0)[0]:
        data = os.read(ctl, 65536)
        if not data:
            return
        watch.feed(data)


def _stop(child: subprocess.Popen, dump: int) -> None:
    """Ask for the stack (SIGUSR1: the child's faulthandler dumps it; up to GRACE seconds until it is written
    and stops growing), then kill the child's process group."""
    start = last = os.fstat(dump).st_size
    deadline = time.monotonic() + GRACE
    try:
        os.kill(child.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
        size = os.fstat(dump).st_size
        if start < size == last:
            break
        last = size
    _kill_group(child.pid)
    child.wait()


class Forwarding:
    """While the child runs: SIGINT/SIGTERM/SIGHUP go to its process group; a second one (or GRACE seconds
    later) kills it."""

    def __init__(self, child: subprocess.Popen, watch: Watch):
        self.child, self.watch, self.saved = child, watch, {}

    def __enter__(self):
        for sig in FORWARDED:
            self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

    def _handle(self, sig: int, _frame) -> None:
        if self.watch.signalled is not None:
            _kill_group(self.child.pid)
            return
        self.watch.signalled, self.watch.kill_at = sig, time.monotonic() + GRACE
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            pass


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group (the child, and what the target started that did not leave it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _high(fd: int) -> int:
    """The descriptor moved to 3 or above (never onto a closed stdin, stdout or stderr), close-on-exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved

