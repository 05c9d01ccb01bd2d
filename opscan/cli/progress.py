"""CLI layer: long work made visible — what the scan is doing now, on a terminal, and advice on `--fake`.

`StageDisplay` shows the run's current stage (RunContext.progress and the stages of the target's code: "running the
training step of gpt2.py:build_model", "judging 4,547 calls for torch 2.14.1") as one rich status line on stderr with
a spinner and the seconds it has run, cleared when the work ends; it is off when stderr is not a terminal (piped
output and CI stay quiet) and with -q. The probes draw their own bar (probe/progress.py).

`fake_advice` is the hint a long real-tensor scan ends with: the seconds the step ran on real tensors, and about how
long a fake-tensor trace of as many calls takes (FAKE_SECONDS_PER_CALL, measured: GPT-2's training step, 4,074
calls, traced in 2.2 s with --fake against 39 s on real tensors on this project's shared 2-core machine).
"""

from __future__ import annotations

import sys
import time

FAKE_SECONDS_PER_CALL = 0.0006  # a fake-tensor trace's cost per call (see the module docstring), rounded up
ADVISE_ABOVE = 10.0  # seconds of real-tensor step before --fake is suggested
STEP_STAGES = ("running the training step", "running the inference forward", "calling ")


class StageDisplay:
    """One status line on a terminal's stderr: a spinner, the current stage and its seconds (see the module
    docstring). Call it with the stage (None hides it); `close()` ends it."""

    def __init__(self, stream=None):
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self.what, self.since = "", time.monotonic()
        self.spinner = Spinner("dots", "")
        console = Console(file=stream or sys.stderr, highlight=False)
        self.live = Live(self, console=console, transient=True, refresh_per_second=8, redirect_stdout=False,
                         redirect_stderr=False)
        self.started = False

    def __call__(self, what: str | None) -> None:
        if what is None:
            self.close()
            return
        if what != self.what:
            self.what, self.since = what, time.monotonic()
        if not self.started:
            self.live.start()
            self.started = True

    def __rich__(self):
        from rich.text import Text

        text = f"{self.what} · {time.monotonic() - self.since:.0f} s"
        self.spinner.update(text=Text(text, no_wrap=True, overflow="ellipsis"))
        return self.spinner

    def close(self) -> None:
        """Clear the line (it may be shown again by the next stage)."""
        if self.started:
            self.live.stop()
            self.started = False


def display_for(stream, quiet: int) -> StageDisplay | None:
    """A StageDisplay when `stream` is a terminal and -q was not given, else None."""
    try:
        tty = bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        tty = False
    return StageDisplay(stream) if tty and not quiet else None


def fake_advice(timings, calls: int, fake: bool) -> str | None:
    """The --fake hint for a real-tensor scan whose step (and its model's building) ran long, else None."""
    if fake:
        return None
    real = sum(seconds for name, seconds in timings if name.startswith(STEP_STAGES))
    estimate = max(1.0, calls * FAKE_SECONDS_PER_CALL)
    if real < ADVISE_ABOVE or real < 2 * estimate:
        return None
    return (f"the step ran on real tensors for {real:.0f} s; --fake builds and traces it with fake tensors, which "
            f"compute nothing: about {estimate:.0f} s for its {calls:,} calls, saving about {real - estimate:.0f} s "
            "(the verdicts are the same unless the step reads tensor values: docs/trace.md)")
