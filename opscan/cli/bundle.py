"""CLI: `opscan bundle TARGET [scan flags] [--device mps] -o DIR` — the probes packed for a Mac.

Traces the step, plans its probes for the device (the cap of measured mode) and writes DIR/ and DIR.zip
(opscan/bundle/make.py); stdout gets the two paths. The manifest keeps the scan options as data
(opscan/bundle/options.py) for `opscan merge`. Exit codes as the scan's.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from opscan.cli.command import Command, from_start
from opscan.cli.common import emit, quiet_torch_logs
from opscan.cli.files import prepare_folder, write_whole
from opscan.cli.options import seconds
from opscan.cli.scan_flags import build_parser as scan_parser
from opscan.cli.scan_flags import scan_options
from opscan.errors import ExitCode, OutputError, UsageError
from opscan.target.run import RunContext
from opscan.trust.names import inside, safe_name

log = logging.getLogger("opscan")
OUTPUT_FLAGS = ("-o", "--output-dir")


def bundle_parser() -> argparse.ArgumentParser:
    """The scan's parser, for `opscan bundle` (the options it gives go into the manifest as data)."""
    p = scan_parser()
    p.prog = "opscan bundle"
    p.description = ("Trace the step here and write a self-contained folder and zip that measures it on a Mac "
                     "with only Python and torch: `./run.sh` there, then `opscan merge results.jsonl` here.")
    p.epilog = "the scan's own flags set what is traced and probed; -o DIR (default bundles/<model>) gets the bundle"
    p.add_argument("--repro-timeout", type=seconds, default=120.0, metavar="S",
                   help="limit for each repro script run.sh runs after the probes, seconds above zero (120 s)")
    return p


def main(argv: list[str], ctx: RunContext | None = None) -> int:
    """`opscan bundle`; returns the exit code."""
    given = len(scan_argv(argv)) != len(argv)  # no -o: bundles/<model>, not the scan's OPSCAN_OUTPUT_DIR default

    def body(args, ctx: RunContext) -> int:
        if not given:
            args.output_dir = None
        args.repro = True  # merged reports carry repro files
        quiet_torch_logs(ctx, args.verbose)
        return _bundle(args, ctx)

    return Command(bundle_parser, body).main(argv, ctx)


def scan_argv(argv: list[str]) -> list[str]:
    """argv without the output folder (-o/--output-dir and its value)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in OUTPUT_FLAGS:
            skip = True
        elif not (word.startswith("--output-dir=") or (word.startswith("-o") and not word.startswith("--"))):
            out.append(word)
    return out


def _bundle(args, ctx: RunContext) -> int:
    from opscan.bundle.make import BundleSpec, bundle_files
    from opscan.bundle.merge import repro_files
    from opscan.bundle.options import options_to_data
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
    prepared = prepare(options, ctx)
    name = prepared.target.name
    folder = from_start(args, Path(args.output_dir or Path("bundles") / safe_name(name)))
    check_new(folder)
    log.info("planning the probes for %s …", device)
    probe_plan = plan(prepared.trace, prepared.view, device, max_elements)
    timeout = ProbeOptions(timeout=args.probe_timeout).timeout
    # the predicted findings' scripts, from the same trace
    repro, repro_probes = repro_files(scan(options, prepared=prepared, ctx=ctx), device)
    spec = BundleSpec(args.target, name, options_to_data(options), probe_plan, args.workers, timeout,
                      repro=repro, repro_probes=repro_probes, repro_timeout=args.repro_timeout)
    files = bundle_files(spec, folder.name)
    archive = _write(ctx, folder, files)
    log.warning("wrote the bundle %s (%d probes on %s, %d repro files) and %s — on the Mac: ./run.sh, then "
                "`opscan merge results.jsonl --bundle %s`", folder, len(probe_plan.probes), device,
                len(repro or {}), archive, folder)
    emit(ctx, f"{folder}\n{archive}\n")
    return ExitCode.OK


def _write(ctx: RunContext, folder: Path, files: dict[str, bytes]) -> Path:
    """The bundle folder, its zip and its record in this machine's store (what merge trusts: opscan/bundle/
    record.py), all written whole or none; the zip's path."""
    from opscan.bundle import MANIFEST
    from opscan.bundle.make import zip_bytes
    from opscan.bundle.record import record_path, store

    manifest = files[MANIFEST]
    record = record_path(json.loads(manifest)["bundle_hash"])
    try:
        store().mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot record the bundle in {store()}: {exc.strerror or exc} — set XDG_STATE_HOME to "
                          "a writable folder (merge needs the record)") from None
    archive = folder.with_name(folder.name + ".zip")
    prepare_folder(ctx, folder)
    write_whole(ctx, {**{inside(folder, rel): data for rel, data in files.items()},
                      archive: zip_bytes(files, folder.name), record: manifest}, executable=(folder / "run.sh",),
                root=folder)
    return archive


def check_new(folder: Path) -> None:
    """Refuse (UsageError) a bundle folder that exists and is not empty, or whose DIR.zip exists."""
    archive = folder.with_name(folder.name + ".zip")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} already exists and is not empty — pass -o with a new folder for the bundle")
    if archive.exists():
        raise UsageError(f"{archive} already exists — remove it, or pass -o with a new folder for the bundle")
