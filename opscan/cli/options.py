"""CLI layer: flags whose default comes from the environment, and numeric flags checked like any other value.

Each OPSCAN_* variable is the default of one flag and is read by that flag's own rule (its type, its choices)
after argparse and before any work: a bad value is exit 2 with one line naming the variable. A flag given on
the command line wins (its variable is then not read); an empty variable counts as unset. `--help` and
`--version` never read them. Numbers are checked where argparse reads them: a count is a whole number of at
least its minimum, a limit in seconds is a finite number above zero.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from opscan.errors import UsageError

DEFAULT_STEP_TIMEOUT = 600.0  # seconds a stage of the target's code may run (import, factory, the traced step)


class Parser(argparse.ArgumentParser):
    """argparse with opscan's error line: `opscan: error: <what> — <how to fix it>` (after the usage), exit 2."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        fix = "" if " — " in message else f" — see {self.prog} --help"
        self.exit(2, f"opscan: error: {message}{fix}\n")

    def parse_or_code(self, argv: list[str]) -> argparse.Namespace | int:
        """The parsed flags, or the exit code argparse ended with (--help/--version 0, a usage error 2)."""
        try:
            return self.parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)


def env_flag(parser, *flags: str, env: str, default=None, **kwargs) -> argparse.Action:
    """parser.add_argument(*flags, **kwargs) whose default is $env (read by `apply_environment`), else `default`."""
    action = parser.add_argument(*flags, default=None, **kwargs)
    parser.__dict__.setdefault("opscan_env", []).append((action, env, default))
    return action


def apply_environment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill each flag not given from its variable, by the flag's rule (UsageError naming the variable), else
    its default."""
    for action, env, default in parser.__dict__.get("opscan_env", []):
        if getattr(args, action.dest) is not None:
            continue
        text = os.environ.get(env, "")
        setattr(args, action.dest, _read(action, env, text) if text else default)
    return args


def _read(action: argparse.Action, env: str, text: str):
    flag = action.option_strings[-1]
    try:
        value = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        why = str(exc).split(" — ")[0] if isinstance(exc, argparse.ArgumentTypeError) else f"not a valid {flag} value"
        raise UsageError(f"{env}={text!r}: {why} — fix or unset {env}, or pass {flag}") from None
    if action.choices is not None and value not in action.choices:
        raise UsageError(f"{env}={text!r} is not one of {', '.join(map(str, action.choices))} (the values of {flag}) "
                         f"— fix or unset {env}, or pass {flag}")
    return value


def count(minimum: int = 1):
    """argparse type: a whole number >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum} — pass {minimum} or more")
        return value
    parse.__name__ = "count"
    return parse


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds above zero."""
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a limit — pass a number of seconds above zero")
    return value


def seed(text: str) -> int:
    """argparse type: a seed torch.manual_seed takes (-2**63 ... 2**64 - 1)."""
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not -(1 << 63) <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{value} is out of range for a seed — pass -2**63 ... 2**64 - 1")
    return value
