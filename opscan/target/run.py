"""Target stage: the run context — what one run of opscan keeps while it runs, passed down explicitly.

One `RunContext` is made per run: by the CLI's dispatcher for a command (the supervised child gives it the
supervisor's callbacks), by the zoo's worker task for each model, and by `scan()` itself for a Python caller
that passes none. It holds:

- where the command started (`start_dir`), against which relative paths of the command line are resolved
  (the target's code may change directory);
- the stages of the target's code running now (`running(what)` brackets every call into it: importing it, its
  factory, the traced step, the memory runs, the acceptance runs), told to `on_stage` (the supervisor's
  channel: a stage of user code gets `--step-timeout`, and a process that dies is reported with what it was
  doing); `sys.exit()` raised inside becomes a TargetExit (exit 2) naming the call and its line;
- what opscan itself is doing between those stages (`progress(what)`: "predicting 1,204 calls", ...), told with
  the stage of the target's code to `on_progress` (the CLI's display on a terminal), and how long each took
  (`timings`: the scan's advice on --fake reads them);
- the CLI's bookkeeping: the folders the run created (removed again when it ends without writing into them,
  each one told to `on_folder`), the loggers whose level it changed, and the stream the artefact goes to while
  the command's own stdout goes to stderr.

It lives in the first stage so that every later one can take it; nothing here imports torch. Nothing of a run
is kept in module globals (tests/test_layering.py checks it).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opscan.target.user_code import exit_error

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # models are built from configs: nothing downloaded


@dataclass(eq=False)
class RunContext:
    """One run's state (see the module docstring); mutable, and made afresh for every run."""

    start_dir: str | None = None  # where the command started; None: the current directory
    on_stage: Callable[[str | None], None] | None = None  # the supervisor: a stage of user code began or ended
    on_folder: Callable[[str], None] | None = None  # ... a folder was created
    on_config: Callable[..., None] | None = None  # ... the step limit and -v (limit=, verbose=)
    stages: list[str] = field(default_factory=list)  # the target's code running now, innermost last
    created: list[Path] = field(default_factory=list)  # folders this run created, deepest last
    restore: list[tuple[Any, int]] = field(default_factory=list)  # (logger, level) to put back at the end
    artefact: list = field(default_factory=list)  # the real stdout while the command's own goes to stderr
    on_progress: Callable[[str | None], None] | None = None  # a display of what the run does now (CLI, terminal)
    doing: str | None = None  # opscan's own work now (progress)
    timings: list[tuple[str, float]] = field(default_factory=list)  # (stage, seconds), each stage once it ended
    _began: dict[str, float] = field(default_factory=dict)

    @property
    def supervised(self) -> bool:
        """Whether a supervisor watches this run (the command line's child process)."""
        return self.on_stage is not None

    def absolute(self, path: Path) -> Path:
        """`path` resolved against `start_dir`, else the current directory."""
        return Path(self.start_dir, path) if self.start_dir and not path.is_absolute() else path.absolute()

    def current(self) -> str | None:
        """What of the target's code runs now (the innermost stage), or None."""
        return self.stages[-1] if self.stages else None

    @contextlib.contextmanager
    def running(self, what: str):
        """Run the target's code as stage `what` ("calling build_model()", "tracing the training step of X")."""
        self.stages.append(what)
        self._began[what] = time.monotonic()
        self._tell()
        pid = os.getpid()
        try:
            yield
        except SystemExit as exc:
            raise exit_error(exc, what) from None
        except KeyboardInterrupt as exc:
            exc.__dict__.setdefault("opscan_stage", what)  # the innermost stage: for "interrupted while ..."
            raise
        finally:
            self.stages.pop()
            if os.getpid() != pid:  # a process the target forked came back into opscan: it must not scan twice
                os._exit(0)
            self._ended(what)
            self._tell()

    def progress(self, what: str | None) -> None:
        """Say what opscan itself does now (None: nothing more to show); the previous step's time is recorded."""
        if self.doing is not None:
            self._ended(self.doing)
        self.doing = what
        if what is not None:
            self._began[what] = time.monotonic()
        if self.on_progress is not None:
            self.on_progress(self.current() or what)

    def seconds(self, prefix: str) -> float:
        """The time the stages whose name begins with `prefix` took, together."""
        return sum(t for name, t in self.timings if name.startswith(prefix))

    def _ended(self, what: str) -> None:
        began = self._began.pop(what, None)
        if began is not None:
            self.timings.append((what, time.monotonic() - began))

    def folder_made(self, folder: Path) -> None:
        """Record a folder this run created (and tell the supervisor)."""
        self.created.append(folder)
        if self.on_folder is not None:
            self.on_folder(str(folder))

    def configure(self, limit: float | None, verbose: int) -> None:
        """Tell the supervisor (when there is one) the limit for each stage of the target's code, and -v."""
        if self.on_config is not None:
            self.on_config(limit=limit, verbose=verbose)

    def _tell(self) -> None:
        if self.on_stage is not None:
            self.on_stage(self.current())
        if self.on_progress is not None:
            self.on_progress(self.current() or self.doing)


def offline() -> None:
    """Hugging Face libraries never download (a default: a value the user set stays); the one place opscan sets it."""
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
