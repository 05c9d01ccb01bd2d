"""Target stage: the target's own code in messages — its exits and the frames that are its own.

`exit_error` turns `sys.exit()` raised by the target's code into a TargetExit (exit 2) that names the call and
its line, instead of ending opscan with the target's exit code; `user_frame` and `where_in_dump` find the
innermost frame of the target's code in a traceback or a faulthandler dump. Which stage of the target's code
runs now is the run's (RunContext.running, target/run.py). No torch here.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback

from opscan.errors import TargetError

_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_TORCH_PART = os.sep + "torch" + os.sep
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)')  # a faulthandler line


class TargetExit(TargetError):
    """The target's code raised SystemExit (sys.exit, exit(), quit()) while opscan ran it."""


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
