"""CLI: `opscan coverage`, the MPS knowledge base of one torch release (or the difference of two).

Dispatched from cli.main when the first argument is `coverage`; prints to stdout only, writes no
file, never imports torch. Exit codes as the scan's: 0 done, 2 usage or unknown release, 3 bug.
"""

from __future__ import annotations

import argparse

from opscan.cli.command import Command
from opscan.cli.options import Parser, env_flag
from opscan.errors import ExitCode

EPILOG = """\
kernel: mps (an MPS kernel in native_functions.yaml, own or via structured_delegate) · composite · python
(implemented in Python for MPS) · cpu_fallback (always runs on the CPU) · none. status: the verdict without
dtypes; a composite's is its callees' where the yaml names them, else unknown. since: first covered release
where the status is native. --diff lists kernel changes and status changes apart.
"""


def build_parser() -> argparse.ArgumentParser:
    """The `opscan coverage` parser."""
    from opscan.predict.coverage import KERNELS

    p = Parser(prog="opscan coverage", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Every aten overload of a torch release and what it does on MPS.")
    env_flag(p, "--torch-version", env="OPSCAN_TORCH_VERSION", metavar="X",
             help="the release (default: the installed torch, else the newest covered one; env OPSCAN_TORCH_VERSION)")
    env_flag(p, "--macos", env="OPSCAN_MACOS", metavar="V",
             help="assumed macOS (default: the release's minimum; env OPSCAN_MACOS)")
    p.add_argument("--status", action="append", default=[], metavar="VERDICT",
                   help="keep rows with this status (repeatable or comma-separated)")
    p.add_argument("--kernel", action="append", default=[], choices=KERNELS, help="keep rows with this kernel")
    p.add_argument("--op", metavar="PATTERN", help="keep ops whose name matches (glob, else substring)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="kernel and status changes from release A to B")
    p.add_argument("--no-since", action="store_true", help="skip `since` (judging every release takes a second)")
    env_flag(p, "-f", "--format", env="OPSCAN_FORMAT", default="table", choices=("table", "json", "yaml"),
             help="what stdout carries (env OPSCAN_FORMAT; default table)")
    return p


def _body(args: argparse.Namespace, ctx) -> int:
    from opscan.cli.common import emit

    emit(ctx, _run(args))
    return ExitCode.OK


def _run(args: argparse.Namespace) -> str:
    """The text to print."""
    from opscan.predict import coverage as cov
    from opscan.errors import UsageError

    statuses = [s for text in args.status for s in text.split(",") if s]
    bad = [s for s in statuses if s not in _verdicts()]
    if bad:
        raise UsageError(f"unknown status {bad[0]!r} — use one of {', '.join(_verdicts())}")
    if args.diff:
        a, b = (cov.coverage(r, args.macos, with_since=False) for r in args.diff)
        data = cov.diff(cov.select(a, statuses, args.kernel, args.op), cov.select(b, statuses, args.kernel, args.op))
        return cov.diff_table(data) if args.format == "table" else cov.render(data, args.format)
    found = cov.coverage(_release(args.torch_version), args.macos, with_since=not args.no_since)
    found = cov.select(found, statuses, args.kernel, args.op)
    return cov.table(found) if args.format == "table" else cov.render(found.to_dict(), args.format)


def _release(given: str | None) -> str | None:
    """The release asked for, else the installed torch, else the newest covered release."""
    from opscan.knowledge import installed_release, kb_releases

    return given or installed_release() or kb_releases()[-1]


def _verdicts() -> tuple[str, ...]:
    """Every verdict name."""
    from opscan.verdict import Verdict

    return tuple(v.value for v in Verdict)


main = Command(build_parser, _body, logs=False, prepare=False).main  # `opscan coverage`: main(argv, ctx=None)
