"""CLI: `opscan merge RESULTS [--bundle DIR]` — fold a bundle's results into the measured report.

Validates the results file first (corrupted, foreign, tampered or truncated: exit 2, one line), then takes the
bundle's manifest from the record `opscan bundle` made on this machine (opscan/bundle/record.py: a bundle folder
whose manifest differs from it, or that has none, is exit 2 naming what changed — nothing the folder names is
imported), rebuilds the measured report (opscan/bundle/merge.py), writes report.json/yaml/html/graphml and the
repro files as the scan does, prints the predicted-vs-measured differences on stderr first, then the chosen
format on stdout. Exit codes as the scan's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from opscan.cli.command import Command, output_folder
from opscan.cli.common import VERDICT_NAMES, emit, exit_code, quiet_torch_logs, render, write_reports
from opscan.cli.files import check_owner, identity
from opscan.cli.options import DEFAULT_STEP_TIMEOUT, Parser, seconds
from opscan.errors import UsageError
from opscan.target.run import RunContext
from opscan.trust.text import printable

log = logging.getLogger("opscan")


def build_parser() -> argparse.ArgumentParser:
    """The `opscan merge` parser."""
    p = Parser(prog="opscan merge", description="Fold a bundle's results/results.jsonl (from "
                                "the Mac) into the report a direct measured scan makes; the target must import "
                                "here, with the torch and opscan that made the bundle.")
    p.add_argument("results", metavar="RESULTS", help="results/results.jsonl as run.sh wrote it")
    p.add_argument("--bundle", metavar="DIR", help="the bundle folder (default: the folder above results/)")
    p.add_argument("--target", metavar="SPEC", help="the target's spec here, when it moved (default: the bundle's)")
    p.add_argument("-o", "--output-dir", metavar="DIR", help="where the reports go (default reports/<model>/)")
    p.add_argument("-f", "--format", choices=("table", "json", "yaml"), default="table")
    p.add_argument("--fail-on", choices=VERDICT_NAMES, help="exit 1 when a row ranks at or above this verdict")
    p.add_argument("--step-timeout", type=seconds, default=DEFAULT_STEP_TIMEOUT, metavar="S",
                   help=f"limit for each stage of the target's code (the scan's; default {DEFAULT_STEP_TIMEOUT:g})")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="count", default=0)
    return p


def _merge(args, ctx: RunContext) -> int:
    quiet_torch_logs(ctx, args.verbose)
    from opscan.bundle import results as results_file
    from opscan.bundle.merge import differences, load_bundle, merged_report, real_outputs, trusted


    path = Path(args.results)
    if not path.is_file():
        raise UsageError(f"no results file {path} — pass the results/results.jsonl that run.sh wrote on the Mac")
    folder = Path(args.bundle) if args.bundle else path.resolve().parent.parent
    if not args.bundle and not (folder / "manifest.json").is_file():
        raise UsageError(f"no bundle above {path} — pass --bundle DIR (the folder `opscan bundle -o` wrote)")
    bundle = load_bundle(folder)
    results = results_file.load(path, bundle.hash, bundle.probes, bundle.on_pass)
    bundle = trusted(bundle)  # from here on, the manifest recorded here when the bundle was made: never the folder's
    log.info("results intact: %d outcomes from %s — the sha256 digest rules out corruption and careless edits, not a "
             "deliberate forgery (anyone can recompute it); tracing %s again …", len(results.outcomes),
             (results.environments.get("off") or {}).get("platform", "?"), args.target or bundle.manifest["target"])
    args.identity = identity(args.target or bundle.manifest["target"])
    if args.output_dir:
        check_owner(Path(args.output_dir), args.identity)
    report = merged_report(bundle, results, args.target, ctx)
    lines = differences(report)
    print(printable("\n".join([f"predicted vs measured: {len(lines)} rows differ", *lines])), file=sys.stderr,
          flush=True)
    out_dir = output_folder(ctx, args, report.model_name)
    write_reports(ctx, report, out_dir, real_outputs(results), device=bundle.manifest["device"])
    args.tree = False
    emit(ctx, render(ctx, report, args))
    return exit_code(report, args.fail_on)


main = Command(build_parser, _merge).main  # `opscan merge`: main(argv, ctx=None) -> the exit code
