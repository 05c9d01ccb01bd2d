"""Target stage: the target's own code in messages — its exits and the frames that are its own.

`exit_error` turns `sys.exit()` raised by the target's code into a TargetExit (exit 2) that names the call and
its line, instead of ending opscan with the target's exit code; `user_frame` and `where_in_dump` find the
innermost frame of the target's code in a traceback or a faulthandler dump. Which stage of the target's code
runs now is the run's (RunContext.running, target/run.py). No torch here.

`own_file`, `installed_part`, `anchor_of` and `project_folder` say which files are the user's own code (the
trace's `where`, trace/frames.py): not opscan's, torch's, the standard library's, an installed library's
(site-packages, dist-packages) nor generated code (`<string>`); and the project folder that paths are written
relative to: the nearest folder holding `.git`, `pyproject.toml`, `setup.py` or `setup.cfg`, else the file's own.
A notebook's cell (`notebook_cell`: the file name IPython compiled it under, `/tmp/ipykernel_…/….py` or
`<ipython-input-…>`) is the user's own code, named as IPython names it: `Cell In[n]`.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
import traceback

from opscan.errors import TargetError

_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_TORCH_PART = os.sep + "torch" + os.sep
_INSTALLED = tuple(os.sep + part + os.sep for part in ("site-packages", "dist-packages"))
MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
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


def installed_part(path: str) -> str | None:
    """The path of an installed library's file inside its site-packages (dist-packages) folder, POSIX-style
    ("transformers/models/bert/modeling_bert.py"); None for a file outside them."""
    cut = max(path.rfind(part) + len(part) if part in path else -1 for part in _INSTALLED)
    return path[cut:].replace(os.sep, "/") if cut >= 0 else None


def notebook_cell(path: str | None) -> int | None:
    """The execution count of the IPython cell compiled under the file name `path` (IPython's own map, which its
    tracebacks read for `Cell In[n], line k`); None outside IPython or for a file that is no cell."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    try:
        shell = get() if callable(get) else None
        number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(path)
    except Exception:  # noqa: BLE001 - IPython's internals are not ours: no cell then
        return None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def own_file(path: str) -> bool:
    """Whether an absolute file name is the user's own code (see the module docstring)."""
    if notebook_cell(path) is not None:
        return True
    if path.startswith("<") or installed_part(path) is not None:
        return False
    return not path.startswith(_OPSCAN_DIR) and _TORCH_PART not in path and not path.startswith(_STDLIB_DIR)


def anchor_of(func) -> tuple[str, int, str] | None:
    """(absolute file, line of its `def`, qualname) of a function of the user's own code, else None."""
    code = getattr(func, "__code__", None)
    if code is None or code.co_filename.startswith("<"):
        return None
    path = os.path.abspath(code.co_filename)
    return (path, code.co_firstlineno, getattr(code, "co_qualname", code.co_name)) if own_file(path) else None


def project_folder(file: str) -> str:
    """The project folder of an absolute file name (see the module docstring); a file at the filesystem's root
    has its own folder."""
    folder = os.path.dirname(os.path.abspath(file))
    candidate = folder
    while True:
        if any(os.path.exists(os.path.join(candidate, marker)) for marker in MARKERS):
            return folder if candidate == os.path.dirname(candidate) else candidate
        parent = os.path.dirname(candidate)
        if parent == candidate:
            return folder
        candidate = parent


_real = functools.lru_cache(maxsize=4096)(os.path.realpath)


def relative_to(path: str, folder: str | None) -> str:
    """`path` relative to `folder` (POSIX-style) when it lies inside it — as named, or once links are resolved in
    both (a project reached through a link) — else as it is."""
    for inner, outer in ((path, folder), (_real(path), _real(folder or "/"))):
        if folder and inner.startswith(outer.rstrip(os.sep) + os.sep):
            return inner[len(outer.rstrip(os.sep)) + 1:].replace(os.sep, "/")
    return path


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
