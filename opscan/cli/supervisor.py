"""CLI layer: the thin supervisor `opscan` runs as, started before torch is imported.

opscan runs other people's code, and that code may end the process (`os._exit`, a segfault, a signal), loop
forever, or leave threads and processes behind. So the command line (`opscan ...`, `python -m opscan ...`)
runs the command in a child process (child.py: the ordinary in-process CLI) in a session of its own, with
stdin from /dev/null, and this process only watches it:

- exit codes: the child's own exit code passes through; an exit the child did not announce is the target's
  (`os._exit(3)` in forward, SIGSEGV while calling the factory, SIGKILL: out of memory?) and is exit 2 with one
  line naming the call, its line and the stage (exit 3 only when no code of the target was running);
- `--step-timeout` (OPSCAN_STEP_TIMEOUT): a stage of the target's code (import, factory, the traced step, a
  memory run) that runs longer is stopped: its stack is dumped (where it was: one line; -v: the stack), the
  child's process group is killed, exit 2;
- SIGINT, SIGTERM and SIGHUP are passed to the child (a second one, or 10 s later: SIGKILL), exit 2;
- when the child ends, whatever is left in its process group (the target's subprocesses) is killed, and an
  output folder it created and left empty is removed.

`opscan.cli.main(list)` (tests, Python callers) runs in-process, without all this. No torch here.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from opscan.cli.child import BOOT, ENV, PATH_ENV
from opscan.cli.files import remove_if_empty
from opscan.errors import ExitCode

GRACE = 10.0  # seconds a signalled child gets to end by itself before SIGKILL
POLL = 0.5  # seconds between checks of a child that closed no pipe
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)')


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
        """Take the JSON lines in `data` (a message may be split across reads)."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.take(json.loads(line))

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
    dump = _dump_file()
    ctl_r, ctl_w = (_high(fd) for fd in os.pipe())
    life_r, life_w = (_high(fd) for fd in os.pipe())
    child = _start(argv, ctl_w, life_r, dump)
    for fd in (ctl_w, life_r):
        os.close(fd)
    watch = Watch()
    with Forwarding(child, watch):
        _follow(child, ctl_r, watch)
    _kill_group(child.pid)  # what the target left behind
    code = _outcome(watch, child.returncode, _read_all(dump))
    _remove_empty(watch.dirs)
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
    closed = not _is_open(1)
    env = {**os.environ, ENV: f"{ctl},{lifeline},{dump},{int(closed)}", PATH_ENV: json.dumps(sys.path)}
    flags = subprocess._args_from_interpreter_flags()  # -X, -W, -I ... as this interpreter was started
    return subprocess.Popen([sys.executable, *flags, "-c", BOOT, *argv], env=env, pass_fds=(ctl, lifeline, dump),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL if closed else None,
                            stderr=None if _is_open(2) else subprocess.DEVNULL, start_new_session=True)


def _follow(child: subprocess.Popen, ctl: int, watch: Watch) -> None:
    """Read the child's messages until it ends; stop a stage over its limit; kill a child signalled too long ago."""
    while True:
        now = time.monotonic()
        if watch.overdue(now):
            watch.timed_out = watch.stage
            _stop(child)
            return
        if watch.kill_at is not None and now >= watch.kill_at:
            _kill_group(child.pid)
        ready = select.select([ctl], [], [], watch.wait(now))[0]
        data = os.read(ctl, 65536) if ready else b""
        if data:
            watch.feed(data)
        elif child.poll() is not None:
            _drain(ctl, watch)
            return


def _drain(ctl: int, watch: Watch) -> None:
    """The messages still in the pipe after the child ended (a fork of it may hold the pipe open)."""
    while select.select([ctl], [], [], 0)[0]:
        data = os.read(ctl, 65536)
        if not data:
            return
        watch.feed(data)


def _stop(child: subprocess.Popen) -> None:
    """Ask for the stack (SIGUSR1: the child's faulthandler dumps it), then kill the child's process group."""
    try:
        os.kill(child.pid, signal.SIGUSR1)
        time.sleep(0.5)
    except ProcessLookupError:
        return
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


def _outcome(watch: Watch, returncode: int, dump: str) -> int:
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


def _explain(watch: Watch, returncode: int, dump: str) -> tuple[int, str]:
    """(exit code, message) for an end the child did not announce."""
    stage = watch.timed_out or watch.stage
    during = f" while {stage}" if stage else ""
    if watch.timed_out is not None:
        return ExitCode.USAGE, (f"{watch.timed_out} took longer than the step limit of {watch.limit:g} s; stopped"
                                f"{_where(dump, main_thread=True)} — the target's code may never return: fix it, or "
                                "raise --step-timeout (OPSCAN_STEP_TIMEOUT) if it is only slow")
    if watch.signalled is not None:
        return ExitCode.USAGE, f"interrupted ({signal.Signals(watch.signalled).name}){during}"
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
        what = f"the process died of {name}{_where(dump, main_thread=False)}{during}"
    else:
        what = f"the process ended with exit status {returncode}{during} (exit() from C, or a library's abort)"
    if stage is None:
        return ExitCode.INTERNAL, f"{what} — no code of the target was running: this is a bug in opscan or torch; " \
                                  "please report it with the stack above"
    return ExitCode.USAGE, f"{what} — the target's code ended the process: rerun with -v for the stack, fix it"


def _where(dump: str, main_thread: bool) -> str:
    """' in forward (model.py:12)' from a faulthandler dump: the crashing thread, or the main thread (the one
    whose outermost frame is the child's `-c` program)."""
    from opscan.target.user_code import user_frame

    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    if main_thread:
        chosen = [b for b in blocks if 'File "<string>", line 1 in <module>' in b]
    else:
        chosen = [b for b in blocks if b.lstrip().startswith("Current thread")]
    for block in chosen[-1:]:
        frames = [_summary(m) for m in (_FRAME.match(line) for line in block.splitlines()) if m]
        return user_frame(reversed(frames))  # faulthandler lists the most recent call first
    return ""


def _summary(match: re.Match):
    import traceback

    return traceback.FrameSummary(match["file"], int(match["line"]), match["name"], lookup_line=False)


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGBUS": "bus error", "SIGFPE": "arithmetic"}
    return f"{name} ({meaning[name]})" if name in meaning else name


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group (the child, and what the target started that did not leave it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_empty(dirs: list[str]) -> None:
    """Output folders the child created and left empty (killed before writing) are removed, deepest first."""
    for path in sorted(dirs, key=len, reverse=True):
        remove_if_empty(path)


def _high(fd: int) -> int:
    """The descriptor moved to 3 or above (never onto a closed stdin, stdout or stderr), close-on-exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
