"""CLI layer: `opscan [SUBCOMMAND] ...` in this process — the first word picks the command's module; a word that is
no subcommand and no TARGET (it has no `:`) but is close to a subcommand gets a did-you-mean (exit 2)."""

from __future__ import annotations

import difflib
import importlib
import sys

# `opscan NAME ...`: each subcommand's own module parses the rest (its `main(argv) -> exit code`)
SUBCOMMANDS = {"coverage": "opscan.cli.coverage", "repro": "opscan.cli.repro", "bundle": "opscan.cli.bundle",
               "merge": "opscan.cli.merge", "accept": "opscan.cli.accept", "zoo": "opscan.cli.zoo"}
USAGE = 2  # errors.ExitCode.USAGE, without importing more than this module needs


def run(argv: list[str], ctx=None) -> int:
    """Run the command argv names (default: the scan) here, as the run `ctx` (target/run.py RunContext; the
    supervised child passes one holding the supervisor's callbacks; None: a fresh one); its exit code."""
    from opscan.target.run import RunContext

    meant = misspelt(argv[0]) if argv else None
    if meant is not None:
        print(f"opscan: error: {argv[0]!r} is not a command or a TARGET — did you mean `opscan {meant}`? (a TARGET "
              "is FILE.py:FUNCTION or package.module:FUNCTION; `opscan --help` lists the commands)", file=sys.stderr)
        return USAGE
    module = SUBCOMMANDS.get(argv[0], "opscan.cli.scan") if argv else "opscan.cli.scan"
    rest = argv[1:] if module != "opscan.cli.scan" else argv
    return importlib.import_module(module).main(rest, ctx or RunContext())


def misspelt(word: str) -> str | None:
    """The subcommand `word` most likely meant, when it is none and cannot be a TARGET (no `:`, not a flag)."""
    if word in SUBCOMMANDS or word.startswith("-") or ":" in word:
        return None
    close = difflib.get_close_matches(word.lower(), list(SUBCOMMANDS), n=1, cutoff=0.6)
    return close[0] if close else None
