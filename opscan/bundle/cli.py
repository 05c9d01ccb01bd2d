"""CLI: `opscan bundle TARGET [scan flags] [--device mps] -o DIR` and `opscan merge RESULTS [--bundle DIR]`.

bundle: traces the step, plans its probes for the device (the cap of measured mode) and writes DIR/ and
DIR.zip (make.py); stdout gets the two paths. merge: validates the results file first (corrupted, foreign,
tampered or truncated: exit 2, one line), rebuilds the measured report (merge.py), writes report.json/
yaml/html/graphml and the repro files like the scan does, prints the predicted-vs-measured differences
on stderr first, then the chosen format on stdout. Exit codes as the scan's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from opscan.errors import ExitCode, UsageError

log = logging.getLogger("opscan")
OUTPUT_FLAGS = ("-o", "--output-dir")


def bundle_parser() -> argparse.ArgumentParser:
    """The scan's parser, for `opscan bundle` (its flags are stored and parsed again by merge)."""
    from opscan.cli import build_parser

    p = build_parser()
    p.prog = "opscan bundle"
    p.description = ("Trace the step here and write a self-contained folder and zip that measures it on a Mac "
                     "with only Python and torch: `./run.sh` there, then `opscan merge results.jsonl` here.")
    p.epilog = "the scan's own flags set what is traced and probed; -o DIR (default bundles/<model>) gets the bundle"
    p.add_argument("--repro-timeout", type=float, default=120.0, metavar="S",
                   help="limit for each repro script run.sh runs after the probes (120 s)")
    return p


def _guarded(run, args) -> int:
    from opscan.cli import _configure_logging, run_guarded

    _configure_logging(getattr(args, "verbose", 0) - getattr(args, "quiet", 0))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_guarded(lambda: run(args), getattr(args, "verbose", 0))


def main(argv: list[str]) -> int:
    """`opscan bundle`; returns the exit code."""
    try:
        args = bundle_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    args.scan_argv = scan_argv(argv) + ([] if args.repro else ["--repro"])  # merged reports carry repro files
    if len(scan_argv(argv)) == len(argv):  # no -o: bundles/<model>, not the scan's OPSCAN_OUTPUT_DIR default
        args.output_dir = None
    args.repro = True
    return _guarded(_bundle, args)


def scan_argv(argv: list[str]) -> list[str]:
    """argv without the output folder (the scan flags a merge parses again)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in OUTPUT_FLAGS:
            skip = True
        elif not (word.startswith("--output-dir=") or (word.startswith("-o") and not word.startswith("--"))):
            out.append(word)
    return out


def _bundle(args) -> int:
    from opscan.bundle.make import BundleSpec, bundle_files, zip_bytes
    from opscan.bundle.merge import repro_files, scan_options
    from opscan.cli import _safe
    from opscan.probe.calls import plan
    from opscan.probe.stage import ProbeOptions
    from opscan.scan import prepare, scan

    if args.resume or args.memory or args.probe is False:
        raise UsageError("--resume, --memory and --no-probe do not apply to a bundle — drop them")
    device = args.device or "mps"
    max_elements = None if args.full_shapes else args.max_elements
    options = scan_options(args, None)
    if args.output_dir:
        check_new(Path(args.output_dir))  # before tracing
    prepared = prepare(options)
    name = prepared.target.name
    folder = Path(args.output_dir or Path("bundles") / _safe(name))
    check_new(folder)
    log.info("planning the probes for %s …", device)
    probe_plan = plan(prepared.trace, prepared.view, device, max_elements)
    timeout = ProbeOptions(timeout=args.probe_timeout).timeout
    # the predicted findings' scripts, from the same trace
    repro, repro_probes = repro_files(scan(options, prepared=prepared), device)
    spec = BundleSpec(args.target, name, tuple(args.scan_argv), probe_plan, args.workers, timeout,
                      repro=repro, repro_probes=repro_probes, repro_timeout=args.repro_timeout)
    files = bundle_files(spec, folder.name)
    _write_bundle(folder, files)
    archive = folder.with_name(folder.name + ".zip")
    archive.write_bytes(zip_bytes(files, folder.name))
    log.warning("wrote the bundle %s (%d probes on %s, %d repro files) and %s — on the Mac: ./run.sh, then "
                "`opscan merge results.jsonl --bundle %s`", folder, len(probe_plan.probes), device,
                len(repro or {}), archive, folder)
    print(folder)
    print(archive)
    return ExitCode.OK


def check_new(folder: Path) -> None:
    """Refuse (UsageError) a bundle folder that exists and is not empty, or whose DIR.zip exists."""
    archive = folder.with_name(folder.name + ".zip")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} already exists and is not empty — pass -o with a new folder for the bundle")
    if archive.exists():
        raise UsageError(f"{archive} already exists — remove it, or pass -o with a new folder for the bundle")


def _write_bundle(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (folder / "run.sh").chmod(0o755)


def merge_parser() -> argparse.ArgumentParser:
    """The `opscan merge` parser."""
    from opscan.cli import VERDICT_NAMES

    p = argparse.ArgumentParser(prog="opscan merge", description="Fold a bundle's results/results.jsonl (from "
                                "the Mac) into the report a direct measured scan makes; the target must import "
                                "here, with the torch and opscan that made the bundle.")
    p.add_argument("results", metavar="RESULTS", help="results/results.jsonl as run.sh wrote it")
    p.add_argument("--bundle", metavar="DIR", help="the bundle folder (default: the folder above results/)")
    p.add_argument("--target", metavar="SPEC", help="the target's spec here, when it moved (default: the bundle's)")
    p.add_argument("-o", "--output-dir", metavar="DIR", help="where the reports go (default reports/<model>/)")
    p.add_argument("-f", "--format", choices=("table", "json", "yaml"), default="table")
    p.add_argument("--fail-on", choices=VERDICT_NAMES, help="exit 1 when a row ranks at or above this verdict")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="count", default=0)
    return p


def merge_main(argv: list[str]) -> int:
    """`opscan merge`; returns the exit code."""
    try:
        args = merge_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return _guarded(_merge, args)


def _merge(args) -> int:
    from opscan import cli
    from opscan.bundle import results as results_file
    from opscan.bundle.merge import differences, load_bundle, merged_report, real_outputs

    path = Path(args.results)
    if not path.is_file():
        raise UsageError(f"no results file {path} — pass the results/results.jsonl that run.sh wrote on the Mac")
    folder = Path(args.bundle) if args.bundle else path.resolve().parent.parent
    if not args.bundle and not (folder / "manifest.json").is_file():
        raise UsageError(f"no bundle above {path} — pass --bundle DIR (the folder `opscan bundle -o` wrote)")
    bundle = load_bundle(folder)
    results = results_file.load(path, bundle.hash, bundle.probes, bundle.on_pass)
    log.info("results valid: %d outcomes from %s; tracing %s again …", len(results.outcomes),
             (results.environments.get("off") or {}).get("platform", "?"), args.target or bundle.manifest["target"])
    report = merged_report(bundle, results, args.target)
    lines = differences(report)
    print("\n".join([f"predicted vs measured: {len(lines)} rows differ", *lines]), file=sys.stderr, flush=True)
    out_dir = Path(args.output_dir or Path("reports") / cli._safe(report.model_name))
    cli._check_writable(out_dir)
    cli._write_reports(report, out_dir, real_outputs(results), device=bundle.manifest["device"])
    args.tree = False
    cli._emit(cli._render(report, args))
    return cli._exit_code(report, args.fail_on)
