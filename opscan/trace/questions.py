"""Trace stage: what a trace asks of the release it is made for, and the answers it got.

A trace depends on the predicted-for release only through these questions, each asked while the step runs:
- does the release give op X an MPS kernel (the lens, lens.py, asks it for the row it is deciding);
- should composite X be expanded, its callees recorded (the recorder, recorder.py, once per operator);
- is the assumed macOS at least V (the lens's attention row);
- is the release series at least S (a Python device branch MPS takes only from S on: branches.py `since`);
- mixed precision (amp.py, amp_kernels.py, branches.py), answered by `amp` (opscan/knowledge/autocast.py): what
  `torch.autocast("mps", dtype=D)` does ("enabled float16", "disabled ...", "raises ..."), the AutocastMPS cast
  policy of op X ("fp32", ..., None: no rule; asked per op as the step dispatches it under autocast), and how
  GradScaler.unscale_ treats an MPS scale ("absent", "double", "mps-branch").
`Questions` asks them through the release's own predicates and keeps every answer (`Trace.asked`). The step is
the same code run on the same tensors, so two runs part only where some answer differs: a release whose answers to
every question a trace asked equal that trace's answers gets that very trace (`answers_equal`), and one trace
serves every such release (opscan/zoo/releases.py).
"""

from __future__ import annotations

from typing import Callable

from opscan.opkey import OpKey

KERNEL, EXPAND, MACOS, RELEASE = "kernel", "expand", "macos-at-least", "release-at-least"
AUTOCAST, AUTOCAST_OP, GRADSCALER = "autocast-mps", "autocast-op", "gradscaler-unscale"
AMP = (AUTOCAST, AUTOCAST_OP, GRADSCALER)


def _never(op: OpKey) -> bool:
    return False


class Questions:
    """The release as the trace sees it: `kernel_of(op)` (None: the lens is off, no row applies), `expand_of(op)`
    and the assumed macOS; `amp(question)` answers the mixed-precision questions and `amp.ops` names every op some
    release's AutocastMPS policy lists (None: autocast is left as the installed torch runs it); every answer given
    is kept in `answers`, in the order first asked."""

    def __init__(self, kernel_of: Callable[[OpKey], bool] | None, expand_of: Callable[[OpKey], bool] = _never,
                 macos: tuple[int, int] = (14, 0), amp=None, release: tuple[int, int] | None = None):
        self.kernel_of, self.expand_of, self.macos, self.amp = kernel_of, expand_of, tuple(macos), amp
        self.release = None if release is None else tuple(release)  # the series; None: the installed torch's code
        self.answers: dict[tuple[str, object], object] = {}

    def has_kernel(self, op: OpKey) -> bool:
        """Does the release give `op` an MPS kernel?"""
        return self.ask((KERNEL, op))

    def expands(self, op: OpKey) -> bool:
        """Should the recorder record the callees of composite `op`?"""
        return self.ask((EXPAND, op))

    def macos_at_least(self, version: tuple[int, int]) -> bool:
        """Is the assumed macOS `version` or newer?"""
        return self.ask((MACOS, tuple(version)))

    def autocast_gate(self, dtype: str | None) -> str:
        """What torch.autocast("mps", dtype=dtype) does on a Mac: "enabled <dtype>", "disabled <why>" or
        "raises <error>"."""
        return self.ask((AUTOCAST, dtype))

    def autocast_cast(self, op: str) -> str | None:
        """The AutocastMPS cast policy of `op` (yaml spelling), None when the release has no rule for it."""
        return self.ask((AUTOCAST_OP, op))

    def autocast_ops(self) -> frozenset[str]:
        """Every op some release's AutocastMPS policy lists (not a question: the same for every release)."""
        return frozenset(self.amp.ops) if self.amp is not None else frozenset()

    def gradscaler_path(self) -> str:
        """How GradScaler.unscale_ treats an MPS scale: "absent", "double" or "mps-branch"."""
        return self.ask((GRADSCALER, "unscale_"))

    def release_at_least(self, version: tuple[int, int]) -> bool:
        """Is the predicted-for release series `version` or newer (None: the installed code, which is)?"""
        return self.ask((RELEASE, tuple(version)))

    def ask(self, question: tuple[str, object]):
        """The release's answer to `question`, kept."""
        if question not in self.answers:
            self.answers[question] = self.answer(question)
        return self.answers[question]

    def answer(self, question: tuple[str, object]):
        """The release's answer to `question`, not kept."""
        kind, subject = question
        if kind == KERNEL:
            return bool(self.kernel_of is not None and self.kernel_of(subject))
        if kind == EXPAND:
            return bool(self.expand_of(subject))
        if kind == MACOS:
            return self.macos >= subject
        if kind in AMP:
            return self.amp(question) if self.amp is not None else None
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
