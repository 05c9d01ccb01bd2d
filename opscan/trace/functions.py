"""Trace stage: the trace's one TorchFunctionMode, whose per-function work is a table of jobs.

Python-level work the dispatcher cannot see (which module made an autograd node, which fx node a call is, a
factory called without `device=`, an explicit host move, a `.to(device)` of the user's own) is done by jobs,
each a small object with the torch functions it acts on (`funcs`; None: every call) and `wrap(inner)`, which
returns the function that runs one call (`(func, args, kwargs) -> result`) around `inner`, the rest of the
chain. `StepFunctions` composes the chains once, when it is made: one for every call (the jobs with
`funcs` None), and one per function some job names (that function's jobs, innermost, inside the chain of
every call), so a call costs one dictionary look-up and the frames of the jobs that act on it. A job may also
have `enter()` and `exit()` (module hooks, say), run in table order as the mode is entered and left.

While the mode is on, `torch.overrides.has_torch_function()` is True, so nn.MultiheadAttention and
nn.TransformerEncoderLayer skip their inference fast paths, as they do on MPS, whose device type their lists of
fast-path devices never name (docs/device_branches.md): the mode is that gate too (a pass-through
`StepFunctions()` is the lens's own gate when it runs without a trace around it).

One mode rather than one per job: each TorchFunctionMode re-dispatches every torch function call once more
(docs/performance.md).
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

from torch.overrides import TorchFunctionMode

from opscan.trace.guard import call_args_through

Chain = Callable[[object, tuple, dict], object]  # (func, args, kwargs) -> what the call returns


class Job(Protocol):
    """One job of the mode: the functions it acts on and how it wraps their calls."""

    funcs: frozenset | None  # the torch functions it acts on; None: every call

    def wrap(self, inner: Chain) -> Chain:
        """The function that runs one call, around `inner` (the rest of the chain)."""


class StepFunctions(TorchFunctionMode):
    """Runs every torch function call through the chain of the jobs that act on it (module docstring)."""

    def __init__(self, jobs: Iterable[Job] = ()):
        super().__init__()
        self.jobs = tuple(jobs)
        every = [j for j in self.jobs if j.funcs is None]
        self._every = _chain(every, call_args_through)
        named = {f: None for j in self.jobs if j.funcs is not None for f in j.funcs}
        self._chains: dict = {f: _chain(every, _chain([j for j in self.jobs if j.funcs and f in j.funcs],
                                                       call_args_through))
                              for f in named}

    def __enter__(self):
        for job in self.jobs:
            enter = getattr(job, "enter", None)
            if enter is not None:
                enter()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for job in reversed(self.jobs):
                leave = getattr(job, "exit", None)
                if leave is not None:
                    leave()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self._chains.get(func, self._every)(func, args, kwargs or {})


def _chain(jobs: list, inner: Chain) -> Chain:
    """`inner` wrapped by `jobs`, the first outermost."""
    for job in reversed(jobs):
        inner = job.wrap(inner)
    return inner
