"""Probe stage: the progress bar on stderr — done, failing so far, ETA — redrawn as outcomes arrive."""

from __future__ import annotations

import sys
import time


def bar_text(pass_name: str, done: int, total: int, failing: int, elapsed: float, width: int = 24) -> str:
    """One line: `probing (off) [#########...............] 120/251 · failing 3 · ETA 0:42`."""
    filled = width * done // total if total else width
    eta = "--:--" if not done else _clock(elapsed / done * (total - done))
    return (f"probing ({pass_name}) [{'#' * filled}{'.' * (width - filled)}] {done}/{total} · failing {failing} · "
            f"ETA {eta}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class Progress:
    """Counts outcomes per pass and redraws the bar (only when the stream is a terminal)."""

    def __init__(self, stream=None, enabled: bool | None = None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.clock = clock
        self.pass_name, self.total, self.done, self.failing, self.start = "off", 0, 0, 0, clock()

    def begin(self, pass_name: str, total: int) -> None:
        """A pass starts with `total` probes to run."""
        self.end()
        self.pass_name, self.total, self.done, self.start = pass_name, total, 0, self.clock()

    def outcome(self, outcome) -> None:
        """One more outcome (failing: anything but a clean run)."""
        self.done += 1
        self.failing += 0 if outcome.clean else 1
        self._draw()

    def _draw(self) -> None:
        if self.enabled:
            text = bar_text(self.pass_name, self.done, self.total, self.failing, self.clock() - self.start)
            self.stream.write("\r" + text)
            self.stream.flush()

    def end(self) -> None:
        """Finish the current line."""
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()
