"""Helpers for the hostile-input suite: run `python -m opscan` as a user does and check every promise at once.

`opscan(...)` runs the command line (the supervisor and its child) with this checkout first on the path, a tag
in the environment that every process it starts inherits, and a kill limit (a guard against hanging, not a
speed assertion: it is ten times what any case needs). `check(...)` asserts the exit code, stderr's last line,
no traceback unless -v, that stdout is either empty or parses whole in the chosen format, that no temporary or
partial file is left in the folders given, and that no process carrying the tag is still alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import yaml

from conftest import REPO, TARGETS

HOSTILE = TARGETS / "hostile.py"
TINY = f"{TARGETS / 'tiny.py'}:build_model"
KILL_LIMIT = 300.0  # seconds: only a hang of opscan itself reaches it
TAG = "HOSTILE_TEST_TAG"


@dataclass(frozen=True)
class Run:
    """One finished command line."""

    code: int
    out: str
    err: str
    tag: str

    @property
    def last(self) -> str:
        """stderr's last line."""
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""

    @property
    def error(self) -> str:
        """stderr's `opscan: error:` line (with -v, what follows it is the traceback or the stacks)."""
        return next((line for line in self.err.splitlines() if line.startswith("opscan: error:")), "")


def target(factory: str = "build_model") -> str:
    """TARGET of the hostile file."""
    return f"{HOSTILE}:{factory}"


# `python -c LAUNCH FSIZE CLOSE ARGV...`: set a file-size limit (FSIZE bytes, 0: none) and close stdout (CLOSE 1)
# as a shell would (`ulimit -f`, `>&-`), then become `python -m opscan ARGV` (no preexec_fn: the tests use threads)
LAUNCH = ("import os, resource, sys\n"
          "size, close = int(sys.argv[1]), sys.argv[2] == '1'\n"
          "if size: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))\n"
          "if close: os.close(1)\n"
          "os.execv(sys.executable, [sys.executable, '-m', 'opscan', *sys.argv[3:]])")


def opscan(*argv: str, cwd: Path | None = None, env: dict | None = None, stdout=subprocess.PIPE,
           limit: float = KILL_LIMIT, file_size: int = 0, close_stdout: bool = False) -> Run:
    """`python -m opscan ARGV` as a user runs it (under `ulimit -f` when file_size, with stdout closed when
    close_stdout); the run is killed (and the test fails) past `limit`."""
    tag = uuid.uuid4().hex
    full = {k: v for k, v in os.environ.items() if not k.startswith("OPSCAN_")}
    full.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **{TAG: tag}, **(env or {}))
    command = [sys.executable, "-c", LAUNCH, str(file_size), str(int(close_stdout)), *argv]
    proc = subprocess.Popen(command, cwd=cwd, env=full, stdout=stdout, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"opscan {' '.join(argv)} still ran after the {limit:g} s kill limit") from None
    return Run(proc.returncode, (out or b"").decode("utf-8", "replace"), err.decode("utf-8", "replace"), tag)


def check(run: Run, code: int, last: str | tuple[str, ...] = (), fmt: str | None = None, folders=(),
          verbose: bool = False, fix: bool = True) -> None:
    """Every promise of the exit-code contract for one run (see the module docstring); `fix`: an exit-2 line
    names the fix after ' — '."""
    assert run.code == code, f"exit {run.code}, expected {code}\n{run.err}"
    line = run.last if not verbose else run.error  # -v: the user's traceback or the stacks come after the line
    for fragment in (last,) if isinstance(last, str) else last:
        assert fragment in line, f"{fragment!r} not in stderr's line {line!r}\n{run.err}"
    if code == 2:
        assert line.startswith("opscan: error: ") and (" — " in line or not fix), line
    if not verbose:
        assert "Traceback" not in run.err and "Fatal Python error" not in run.err, run.err
    parses(run.out, fmt, code)
    for folder in folders:
        whole(Path(folder))
    left = alive(run.tag)
    assert left == [], f"processes left behind: {left}"


def parses(out: str, fmt: str | None, code: int) -> None:
    """stdout is empty after an error, else the whole document in its format."""
    if code not in (0, 1):
        assert out == "", f"stdout after exit {code}: {out[:300]!r}"
        return
    if fmt == "json":
        json.loads(out)
    elif fmt == "yaml":
        assert isinstance(yaml.safe_load(out), dict)
    elif fmt == "junit":
        assert ET.fromstring(out).tag == "testsuites"


def whole(folder: Path) -> None:
    """No temporary file, and every report file there parses to its end."""
    if not folder.exists():
        return
    leftovers = [p.name for p in folder.rglob("*") if p.name.endswith(".opscan-tmp")]
    assert leftovers == [], f"temporaries left in {folder}: {leftovers}"
    for path in folder.rglob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))
    for path in folder.rglob("*.yaml"):
        yaml.safe_load(path.read_text(encoding="utf-8"))
    for path in [*folder.rglob("*.graphml"), *folder.rglob("*.html")]:
        assert path.read_text(encoding="utf-8").rstrip().endswith(">"), f"{path} is cut short"


def alive(tag: str, patience: float = 30.0) -> list[str]:
    """Processes (not zombies) whose environment carries the tag: what a run left behind. Killed ones may take a
    moment to die on a busy machine: they are looked for again until `patience` runs out (a bound, not a
    measurement)."""
    deadline = time.monotonic() + patience
    while (found := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _tagged(tag: str) -> list[str]:
    found: list[str] = []
    for proc in Path("/proc").glob("[0-9]*"):  # no /proc (macOS): nothing to look at
        try:
            if f"{TAG}={tag}".encode() not in (proc / "environ").read_bytes():
                continue
            state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" not in state:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:120]
            found.append(f"{proc.name}: {command!r}")
    return found


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under folder (relative path -> content): to prove nothing was deleted or changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_all(cases: dict[str, dict], root: Path) -> dict[str, tuple[Run, Path]]:
    """Run independent cases at once (as many as there are cores, at least two): name -> (Run, its folder).
    A case is {"argv": [...], "env": {...}, "cwd": bool, "setup": callable(folder), "file_size": bytes,
    "stdout": "full" | "closed" | "broken"}; "{dir}" in an argument or an environment value is the case's own
    folder. What each case checks does not depend on the others."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_one, name, case, root) for name, case in cases.items()}
        return {name: future.result() for name, future in futures.items()}


def _one(name: str, case: dict, root: Path) -> tuple[Run, Path]:
    folder = root / name
    folder.mkdir()
    if case.get("setup"):
        case["setup"](folder)
    argv = [a.replace("{dir}", str(folder)) for a in case["argv"]]
    env = {k: v.replace("{dir}", str(folder)) for k, v in case.get("env", {}).items()}
    cwd = folder if case.get("cwd") else REPO
    with _stdout(case.get("stdout")) as stdout:
        return opscan(*argv, env=env, cwd=cwd, stdout=stdout, file_size=case.get("file_size", 0),
                      close_stdout=case.get("stdout") == "closed"), folder


@contextlib.contextmanager
def _stdout(kind: str | None):
    """stdout for a case: a pipe read here (None), /dev/full, or a pipe whose reader is already gone."""
    if kind is None:
        yield subprocess.PIPE
    elif kind == "full":
        with open("/dev/full", "wb") as full:
            yield full
    elif kind == "closed":  # the launcher closes descriptor 1 before it becomes opscan
        yield subprocess.DEVNULL
    else:
        read, write = os.pipe()
        os.close(read)
        with open(write, "wb") as broken:
            yield broken
