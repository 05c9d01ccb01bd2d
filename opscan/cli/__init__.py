"""CLI layer: `opscan [SUBCOMMAND] ...`; nothing outside opscan/cli imports it.

dispatch.py picks the command's module: scan.py (`opscan TARGET`), coverage.py, repro.py, bundle.py, merge.py,
accept.py, zoo.py, and makes the run's RunContext (opscan/target/run.py). Each command's `main(argv, ctx=None) ->
exit code` is a command.Command (the one command base: parse, logging, the environment's flags and absolute paths,
the exit-code guard); no command module imports another. What they share: common.py (the exit-code guard,
emitting, logging, the report files), files.py (the file writing and the output folders), read.py (the user's
report files read: the baseline), options.py (the environment defaults and the number checks), scan_flags.py (the
scan's flags, which `opscan bundle` takes too). Only __main__ calls sys.exit.

The command line (`main()` without argv: the `opscan` script, `python -m opscan`) runs the command in a child
process under a thin supervisor (supervisor.py, child.py, endings.py), started before torch is imported; `main(list)`
(tests, Python callers) runs it in this process. Nothing here imports torch, so `opscan --help` stays light.
"""

from __future__ import annotations

import sys

from opscan.cli.dispatch import SUBCOMMANDS, run

__all__ = ["SUBCOMMANDS", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (only __main__ calls sys.exit). No argv: the command line, supervised."""
    if argv is None:
        from opscan.cli.supervisor import supervise

        return supervise(sys.argv[1:])
    return run(argv)
