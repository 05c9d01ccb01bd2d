"""CLI layer: `opscan [SUBCOMMAND] ...` — dispatch to one module per command; nothing outside opscan/cli imports it.

scan.py (`opscan TARGET`), coverage.py, repro.py, bundle.py, merge.py, accept.py; common.py holds what they share
(the exit-code guard, emitting, logging, the report files). Each command's `main(argv) -> exit code`; only
__main__ calls sys.exit. Nothing here imports torch, so `opscan --help` stays light.
"""

from __future__ import annotations

import gc
import importlib
import sys

# `opscan NAME ...`: each subcommand's own module parses the rest (its `main(argv) -> exit code`)
SUBCOMMANDS = {"coverage": "opscan.cli.coverage", "repro": "opscan.cli.repro", "bundle": "opscan.cli.bundle",
               "merge": "opscan.cli.merge", "accept": "opscan.cli.accept"}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (only __main__ calls sys.exit)."""
    ending = argv is None  # called as the process itself (console script, python -m opscan): it ends next
    argv = sys.argv[1:] if argv is None else argv
    module = SUBCOMMANDS.get(argv[0], "opscan.cli.scan") if argv else "opscan.cli.scan"
    rest = argv[1:] if module != "opscan.cli.scan" else argv
    code = importlib.import_module(module).main(rest)
    if ending:  # the interpreter's final collection then skips every object (~2 s of teardown after a 7B scan)
        gc.freeze()
    return code
