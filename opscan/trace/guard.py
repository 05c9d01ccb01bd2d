"""Trace stage: tell the user's failures apart from opscan's own while the step runs."""

from __future__ import annotations

import contextlib
import os
import traceback

from opscan.errors import StepError
from opscan.target.run import RunContext

_OPSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call_through(func, *args, **kwargs):
    """Call user or torch code from inside opscan's modes; errors raised here are not opscan's."""
    return func(*args, **kwargs)


def call_args_through(func, args, kwargs):
    """call_through with the arguments as a tuple and a dict (the innermost link of trace/functions.py's
    chains)."""
    return func(*args, **kwargs)


_THROUGH = frozenset({call_through.__name__, call_args_through.__name__})


def _raised_by_opscan(exc: BaseException) -> bool:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code, tb.tb_next
    if last is None:
        return False
    return last.co_filename.startswith(_OPSCAN_DIR) and last.co_name not in _THROUGH


def user_frames(exc: BaseException) -> str:
    """The exception's traceback without opscan's own frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OPSCAN_DIR)]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "Traceback (opscan frames removed):\n" + "".join(lines)


@contextlib.contextmanager
def user_step(spec: str, what: str | None = None, ctx: RunContext | None = None):
    """Run the target's step as a stage of user code of the run `ctx` (`what`, default "running the training
    step of SPEC": the supervisor's limit, sys.exit caught) and re-raise failures that start outside opscan (the
    model, its inputs, torch) as StepError."""
    with (ctx or RunContext()).running(what or f"running the training step of {spec}"):
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            if _raised_by_opscan(exc):
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            said = f"the training step of {spec} failed: {type(exc).__name__}: {first} — check that the inputs fit "
            raise StepError(
                said + "the model (--input, example_inputs()) and rerun with -v",
                user_traceback=user_frames(exc),
                api=said + "the model (example_inputs); the error's user_traceback attribute holds your frames",
            ) from None
