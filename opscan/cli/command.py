"""CLI layer: the command base — how every subcommand parses, sets up and runs, and the argument handling they share.

Each command module's `main(argv, ctx=None)` is a `Command`: its parser, its body `body(args, ctx) -> exit code`,
run under the exit-code guard (common.run_guarded) with the run's context (target/run.py RunContext, made by the
dispatcher). Commands that run the target's code (`prepare=True`) first take the environment's flags, make the
command line's paths absolute and tell the supervisor the step limit (`prepare_args`). No command module imports
another: what two of them share lives here, in common.py, files.py or scan_flags.py.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opscan.cli.common import check_writable, configure_logging, run_guarded
from opscan.cli.files import check_owner, claim, identity
from opscan.cli.options import apply_environment
from opscan.target.run import RunContext, offline
from opscan.trust.names import safe_name

PATH_FLAGS = ("baseline", "results", "bundle", "report", "spec")  # made absolute before the target's code runs


@dataclass(frozen=True)
class Command:
    """One subcommand: its parser and body, and which of the shared set-up steps it takes."""

    build_parser: Callable[[], argparse.ArgumentParser]
    body: Callable[[argparse.Namespace, RunContext], int]
    logs: bool = True  # opscan's logger to stderr at -v/-q's level (accept sets up its own)
    prepare: bool = True  # prepare_args (the target's code runs); else only the environment's flags

    def main(self, argv: list[str], ctx: RunContext | None = None) -> int:
        """Parse `argv` and run the body under the exit-code guard; the exit code."""
        ctx = ctx or RunContext()
        parser = self.build_parser()
        args = parser.parse_or_code(argv)
        if isinstance(args, int):
            return args
        verbose = getattr(args, "verbose", 0)
        if self.logs:
            configure_logging(verbose - getattr(args, "quiet", 0))

        def body() -> int:
            if self.prepare:
                prepare_args(ctx, parser, args)
            else:
                apply_environment(parser, args)
            return self.body(args, ctx)

        return run_guarded(ctx, body, verbose)


def prepare_args(ctx: RunContext, parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Flags from the environment (exit 2 naming a bad variable), paths made absolute before any of the target's
    code runs (it may change directory), Hugging Face kept offline, and the step limit told to the supervisor."""
    apply_environment(parser, args)
    args.cwd = ctx.start_dir = os.getcwd()
    for name in PATH_FLAGS:
        if getattr(args, name, None):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    if isinstance(getattr(args, "target", None), str):
        args.identity = identity(args.target)
    offline()
    ctx.configure(getattr(args, "step_timeout", None), getattr(args, "verbose", 0))
    return args


def check_output_dir(ctx: RunContext, args) -> None:
    """-o, when given: another target's folder is refused now, before the target's code runs; else it is created
    (removed again when the run writes nothing into it) and must be writable."""
    if args.output_dir:
        check_owner(Path(args.output_dir), args.identity)
        check_writable(ctx, Path(args.output_dir))


def output_folder(ctx: RunContext, args, model_name: str, default: str = "reports") -> Path:
    """-o, else reports/<model>, where opscan was started; claimed for this target (another's is refused)."""
    folder = from_start(args, Path(args.output_dir or Path(default) / safe_name(model_name)))
    claim(ctx, folder, args.identity)
    return folder


def from_start(args, path: Path) -> Path:
    """A relative path of the command line, as meant where opscan started: unchanged while the current directory
    is that one (messages keep the user's spelling), joined to it once the target's code changed directory."""
    try:
        here = os.getcwd()
    except OSError:  # the target removed the directory it moved into
        here = None
    return path if path.is_absolute() or here == args.cwd else Path(args.cwd) / path
