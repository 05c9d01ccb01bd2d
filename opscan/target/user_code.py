"""Target stage: which of the target's code runs now — for the supervisor's limit and for one-line messages.

`running(what)` brackets every call into the target's code: importing it, its factory, the traced step, the
memory runs, the acceptance runs. Entering and leaving tells the listener (the CLI's supervisor channel, when
opscan runs as a command) so that a stage of user code gets `--step-timeout` and a process that dies is
reported with what it was doing; and `sys.exit()` raised inside becomes a TargetExit (exit 2) that names the
call and its line, instead of ending opscan with the target's exit code. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import re
import sysconfig
import traceback
from pathlib import Path
from typing import Callable

from opscan.errors import TargetError

_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_TORCH_PART = os.sep + "torch" + os.sep
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)')  # a faulthandler line
_stack: list[str] = []
_listener: list[Callable[[str | None], None]] = []
_origin: list[str] = []


class TargetExit(TargetError):
    """The target's code raised SystemExit (sys.exit, exit(), quit()) while opscan ran it."""


def start_in(folder: str | None) -> None:
    """Resolve relative paths of the command line (TARGET's file) against `folder` (the CLI: where it started,
    since the target's code may change directory; None: the current directory)."""
    _origin[:] = [folder] if folder else []


def absolute(path: Path) -> Path:
    """`path` resolved against start_in's folder, else the current directory."""
    return Path(_origin[0], path) if _origin and not path.is_absolute() else path.absolute()


def listen(callback: Callable[[str | None], None] | None) -> None:
    """Call `callback(stage or None)` whenever a stage of the target's code begins or ends (None: no listener)."""
    _listener[:] = [callback] if callback is not None else []


def current() -> str | None:
    """What of the target's code runs now (the innermost stage), or None."""
    return _stack[-1] if _stack else None


@contextlib.contextmanager
def running(what: str):
    """Run the target's code as stage `what` ("calling build_model()", "tracing the training step of X")."""
    _stack.append(what)
    _tell()
    pid = os.getpid()
    try:
        yield
    except SystemExit as exc:
        raise exit_error(exc, what) from None
    except KeyboardInterrupt as exc:
        exc.__dict__.setdefault("opscan_stage", what)  # the innermost stage: for "interrupted while ..."
        raise
    finally:
        _stack.pop()
        if os.getpid() != pid:  # a process the target forked came back into opscan: it must not scan twice
            os._exit(0)
        _tell()


def exit_error(exc: SystemExit, what: str | None) -> TargetExit:
    """The one-line error for SystemExit raised by the target's code."""
    where = user_frame(traceback.extract_tb(exc.__traceback__))
    during = f" while {what}" if what else ""
    return TargetExit(f"the target called sys.exit({exc.code!r}){where}{during} — a scanned target must return, not "
                      "end the process: remove the call (or move it under `if __name__ == \"__main__\":`)",
                      user_traceback=_format(exc))


def user_frame(frames) -> str:
    """' in forward (model.py:12)' for the innermost frame outside opscan, torch and the standard library
    (frames: traceback.FrameSummary items, outermost first); '' when there is none."""
    for frame in reversed(list(frames)):
        if _is_users(frame.filename):
            return f" in {frame.name} ({_short(frame.filename)}:{frame.lineno})"
    return ""


def _is_users(filename: str) -> bool:
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(("<frozen", _OPSCAN_DIR)) or _TORCH_PART in path:
        return False
    return not path.startswith(_STDLIB_DIR) or "-packages" + os.sep in path[len(_STDLIB_DIR):]


def _short(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def _format(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines).rstrip("\n")


def _tell() -> None:
    for callback in _listener:
        callback(current())


def frames_of(frame) -> list[traceback.FrameSummary]:
    """A live frame's stack as FrameSummary items, outermost first (for os._exit's caller)."""
    return list(traceback.extract_stack(frame)) if frame is not None else []


def where_in_dump(dump: str, main_thread: bool) -> str:
    """' in forward (model.py:12)' from a faulthandler dump: the crashing thread, or the main thread (the one
    whose outermost frame is the child's `-c` program)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    if main_thread:
        chosen = [b for b in blocks if 'File "<string>", line 1 in <module>' in b]
    else:
        chosen = [b for b in blocks if b.lstrip().startswith("Current thread")]
    for block in chosen[-1:]:
        frames = [_summary(m) for m in (_FRAME.match(line) for line in block.splitlines()) if m]
        return user_frame(reversed(frames))  # faulthandler lists the most recent call first
    return ""


def _summary(match: re.Match) -> traceback.FrameSummary:
    return traceback.FrameSummary(match["file"], int(match["line"]), match["name"], lookup_line=False)
