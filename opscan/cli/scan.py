"""CLI: `opscan TARGET [flags]`, the scan — parse the flags (scan_flags.py), run opscan.scan, print the chosen
format, write the report files and map the exit code. torch and every stage are imported lazily so
`opscan --help` stays light.
"""

from __future__ import annotations

import argparse
import logging

from opscan.cli.command import Command, check_output_dir, output_folder
from opscan.cli.common import emit, exit_code, quiet_torch_logs, render, write_reports
from opscan.cli.scan_flags import build_parser, live_options, probe_options, scan_options
from opscan.target.run import RunContext

log = logging.getLogger("opscan")


def _run(args: argparse.Namespace, ctx: RunContext) -> int:
    from opscan.target.inputs import parse_arg, parse_input

    for text in args.input:
        parse_input(text)  # reject malformed --input before any slow import
    for text in args.arg:
        parse_arg(text)  # ... and malformed --arg
    if args.torch_version or args.macos or args.chip:
        from opscan.knowledge import load_knowledge

        # an unknown release, macOS or chip fails before tracing
        load_knowledge(release=args.torch_version, macos=args.macos, chip=args.chip)
    baseline = _baseline(args.baseline)
    check_output_dir(ctx, args)  # another target's folder: refused now
    quiet_torch_logs(ctx, args.verbose)
    log.info("tracing %s …", args.target)
    from opscan.trace import collector

    with collector.spared():  # the report's objects outlive the writing too (trace/collector.py)
        report = _scan_shown(args, ctx)
        out_dir = output_folder(ctx, args, report.model_name)
        write_reports(ctx, report, out_dir, keep_paths=args.keep_paths)
        emit(ctx, render(ctx, report, args, baseline), commands=args.format == "github")
        return exit_code(report, args.fail_on, baseline)


def _baseline(path: str | None):
    if not path:
        return None
    from opscan.cli.read import check_report_rows, load_baseline

    check_report_rows(path, "the baseline")
    return load_baseline(path)


def _scan_shown(args, ctx: RunContext):
    """The scan, its stages shown on a terminal (cli/progress.py), then the --fake hint a long real-tensor step
    earns."""
    import sys

    from opscan.cli.progress import display_for, fake_advice

    display = display_for(sys.stderr, args.quiet)
    ctx.on_progress = display
    try:
        report = _scan(args, ctx)
    finally:
        ctx.on_progress = None
        if display is not None:
            display.close()
    advice = fake_advice(ctx.timings, int(report.trace.get("calls") or 0), bool(report.trace.get("fake")))
    if advice:
        log.info("hint: %s", advice)
    return report


def _scan(args, ctx: RunContext):
    from opscan.scan import scan

    probe, session = probe_options(args, ctx)
    return scan(scan_options(args, probe, live=live_options(args)), session, ctx=ctx)


main = Command(build_parser, _run).main  # `opscan TARGET [flags]`: main(argv, ctx=None) -> the exit code
