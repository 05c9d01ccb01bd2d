"""CLI layer: `opscan [SUBCOMMAND] ...` in this process — the first word picks the command's module."""

from __future__ import annotations

import importlib

# `opscan NAME ...`: each subcommand's own module parses the rest (its `main(argv) -> exit code`)
SUBCOMMANDS = {"coverage": "opscan.cli.coverage", "repro": "opscan.cli.repro", "bundle": "opscan.cli.bundle",
               "merge": "opscan.cli.merge", "accept": "opscan.cli.accept", "zoo": "opscan.cli.zoo"}


def run(argv: list[str], ctx=None) -> int:
    """Run the command argv names (default: the scan) here, as the run `ctx` (target/run.py RunContext; the
    supervised child passes one holding the supervisor's callbacks; None: a fresh one); its exit code."""
    from opscan.target.run import RunContext

    module = SUBCOMMANDS.get(argv[0], "opscan.cli.scan") if argv else "opscan.cli.scan"
    rest = argv[1:] if module != "opscan.cli.scan" else argv
    return importlib.import_module(module).main(rest, ctx or RunContext())
