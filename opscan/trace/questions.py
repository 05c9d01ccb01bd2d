"""Trace stage: what a trace asks of the release it is made for, and the answers it got.

A trace depends on the predicted-for release only through four questions, each asked while the step runs:
- does the release give op X an MPS kernel (the lens, lens.py, asks it for the row it is deciding);
- should composite X be expanded, its callees recorded (the recorder, recorder.py, once per operator);
- is the assumed macOS at least V (the lens's attention row);
- is the release series at least S (a Python device branch MPS takes only from S on: branches.py `since`).
`Questions` asks them through the release's own predicates and keeps every answer (`Trace.asked`). The step is
the same code run on the same tensors, so two runs part only where some answer differs: a release whose answers to
every question a trace asked equal that trace's answers gets that very trace (`answers_equal`), and one trace
serves every such release (opscan/zoo/releases.py).
"""

from __future__ import annotations

from typing import Callable

from opscan.opkey import OpKey

KERNEL, EXPAND, MACOS, RELEASE = "kernel", "expand", "macos-at-least", "release-at-least"


def _never(op: OpKey) -> bool:
    return False


class Questions:
    """The release as the trace sees it: `kernel_of(op)` (None: the lens is off, no row applies), `expand_of(op)`
    and the assumed macOS; every answer given is kept in `answers`, in the order first asked."""

    def __init__(self, kernel_of: Callable[[OpKey], bool] | None, expand_of: Callable[[OpKey], bool] = _never,
                 macos: tuple[int, int] = (14, 0), release: tuple[int, int] | None = None):
        self.kernel_of, self.expand_of, self.macos = kernel_of, expand_of, tuple(macos)
        self.release = None if release is None else tuple(release)  # the series; None: the installed torch's code
        self.answers: dict[tuple[str, object], bool] = {}

    def has_kernel(self, op: OpKey) -> bool:
        """Does the release give `op` an MPS kernel?"""
        return self.ask((KERNEL, op))

    def expands(self, op: OpKey) -> bool:
        """Should the recorder record the callees of composite `op`?"""
        return self.ask((EXPAND, op))

    def macos_at_least(self, version: tuple[int, int]) -> bool:
        """Is the assumed macOS `version` or newer?"""
        return self.ask((MACOS, tuple(version)))

    def release_at_least(self, version: tuple[int, int]) -> bool:
        """Is the predicted-for release series `version` or newer (None: the installed code, which is)?"""
        return self.ask((RELEASE, tuple(version)))

    def ask(self, question: tuple[str, object]) -> bool:
        """The release's answer to `question`, kept."""
        if question not in self.answers:
            self.answers[question] = self.answer(question)
        return self.answers[question]

    def answer(self, question: tuple[str, object]) -> bool:
        """The release's answer to `question`, not kept."""
        kind, subject = question
        if kind == KERNEL:
            return bool(self.kernel_of is not None and self.kernel_of(subject))
        if kind == EXPAND:
            return bool(self.expand_of(subject))
        if kind == MACOS:
            return self.macos >= subject
        if kind == RELEASE:
            return self.release is None or self.release >= subject
        raise ValueError(f"unknown trace question {question!r}")

    def asked(self) -> tuple[tuple[tuple[str, object], bool], ...]:
        """Every question asked so far with its answer (Trace.asked)."""
        return tuple(self.answers.items())


def answers_equal(asked, release: Questions) -> bool:
    """True when `release` answers every question of `asked` (a Trace.asked) as the trace's release did: the
    trace is then exactly the one `release` would make (see the module docstring)."""
    return all(release.answer(question) == answer for question, answer in asked)
