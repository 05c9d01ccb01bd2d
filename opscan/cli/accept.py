"""CLI: `opscan accept TARGET`, the acceptance run; the only accept module that writes files.

Dispatched from opscan.cli.main. Prints the summary (or JSON) on stdout, writes the acceptance package
into -o DIR (default reports/<model>/accept/), logs to stderr and to the package's logs/accept.log.
Exit codes: 0 accepted · 1 findings (a comparison beyond tolerance, a failed round trip, or a lane at
or beyond --fail-on-lane) · 2 usage, target or environment error (one line) · 3 internal error.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import sys
from pathlib import Path

from opscan.cli.command import Command, check_output_dir, from_start, output_folder
from opscan.cli.common import check_writable, emit, quiet_torch_logs
from opscan.cli.files import write_whole
from opscan.cli.options import DEFAULT_STEP_TIMEOUT, Parser, count, env_flag, seconds, seed
from opscan.errors import UsageError
from opscan.target.run import RunContext
from opscan.trust.names import safe_name
from opscan.trust.text import strict_json

log = logging.getLogger("opscan")

EPILOG = """\
Runs N real iterations (forward, loss, backward, optimizer step) and an evaluation pass on --device and on
--reference from the same CPU-built initial weights (dropout disabled on both, TF32 off unless allowed),
compares losses, outputs, first gradients, parameters after each step and evaluation outputs within the
tolerances of the target's dtype (docs/accept.md; override with --spec FILE.yaml), saves a
checkpoint on the target, reloads it with weights_only=True on both and continues one step.

exit codes: 0 accepted · 1 findings (beyond tolerance, round trip failed, or lane at/beyond --fail-on-lane)
· 2 usage, target or environment error · 3 internal error (a bug in opscan: please report it)
"""


def build_parser() -> argparse.ArgumentParser:
    """The `opscan accept` parser."""
    p = Parser(prog="opscan accept", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Acceptance run: the real model's real path on a device, against a "
                                            "reference, with a package a second person can rerun.")
    p.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or package.module:FUNCTION")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE:DTYPE[:LOW-HIGH]",
                   help="random input tensor, repeatable (replaces the target's inputs)")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", help="factory keyword argument")
    p.add_argument("--public-arg", action="append", default=[], metavar="KEY",
                   help="record this --arg's value in the package (by default its name only; rerun.sh then reads "
                        "the value from OPSCAN_ARG_KEY)")
    env_flag(p, "--device", env="OPSCAN_DEVICE", default="mps",
             help="the target device: mps (default), cuda, cpu (env OPSCAN_DEVICE)")
    p.add_argument("--reference", default="cpu", help="the reference device (default cpu; runs float32)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="the target's dtype (the reference stays float32); tolerances are this dtype's")
    p.add_argument("--iterations", type=count(1), metavar="N",
                   help="training iterations, 1 or more (default 3, or the spec's)")
    p.add_argument("--seed", type=seed, help="torch.manual_seed before building (default 0, or the spec's)")
    p.add_argument("--spec", metavar="FILE.yaml", help="tolerances, seed and iterations (docs/accept.md)")
    p.add_argument("--allow-tf32", action="store_true", help="allow TF32 on cuda (off by default)")
    p.add_argument("--perturb", metavar="NAME[=EPS]",
                   help="self-test: add EPS (default 1e-3) to parameter NAME on the target only")
    p.add_argument("--fail-on-lane", choices=("dual-track", "linux-gpu-first"), default="linux-gpu-first",
                   help="exit 1 when the measured lane is this or worse (default linux-gpu-first)")
    p.add_argument("--report", metavar="REPORT.json", help="a scan's report.json: its lane is shown as predicted "
                                                          "(default reports/<model>/report.json when present)")
    p.add_argument("-f", "--format", choices=("table", "json"), default="table", help="what stdout carries")
    p.add_argument("-o", "--output-dir", help="the acceptance package folder (default reports/<model>/accept/)")
    env_flag(p, "--step-timeout", env="OPSCAN_STEP_TIMEOUT", default=DEFAULT_STEP_TIMEOUT, type=seconds,
             metavar="S", help="stop the target's code when one stage of it (import, factory, one device's run) runs "
                               f"longer than S seconds (default {DEFAULT_STEP_TIMEOUT:g}; env OPSCAN_STEP_TIMEOUT)")
    p.add_argument("-q", "--quiet", action="count", default=0, help="less on stderr")
    p.add_argument("-v", "--verbose", action="count", default=0, help="on errors, show the user's traceback")
    return p


def _run(args: argparse.Namespace, ctx: RunContext) -> int:
    captured = _configure_logging(args.quiet)
    options = _options(args)
    check_output_dir(ctx, args)
    quiet_torch_logs(ctx, args.verbose)
    from opscan.accept.engine import accept, check_device

    check_device(options.device, "--device")  # before the first log line: a device we can't use is one line
    check_device(options.reference, "--reference")

    log.info("accept %s: %d iterations on %s (%s) and on %s (float32) …", options.target,
             options.spec.iterations, options.device, options.dtype, options.reference)
    result = accept(options, default_report=lambda name: str(from_start(args, Path("reports") / safe_name(name) /
                                                                         "report.json")), ctx=ctx)
    out_dir = output_folder(ctx, args, result.model_name) / "accept" if not args.output_dir else \
        from_start(args, Path(args.output_dir))
    check_writable(ctx, out_dir)
    if result.target_failure:
        log.warning("target run stopped: %s", result.target_failure)
    log.info("first divergence: %s", result.first_divergence.line() if result.first_divergence else "none")
    log.info("lane (measured on %s): %s; exit %d", options.device, result.lane.name, result.exit_code)
    log.info("wrote the acceptance package to %s", out_dir)
    _write_package(ctx, result, out_dir, captured.getvalue(), args.cwd)
    emit(ctx, _render(result, args.format))
    return result.exit_code


def _options(args: argparse.Namespace):
    """AcceptOptions from the flags; every malformed value is a one-line UsageError."""
    from opscan.accept.engine import AcceptOptions
    from opscan.accept.spec import AcceptSpec, load_spec
    from opscan.target.inputs import parse_arg, parse_input, public_name

    for text in args.input:
        parse_input(text)
    spec = load_spec(args.spec) if args.spec else AcceptSpec()
    overrides = {k: v for k, v in (("iterations", args.iterations), ("seed", args.seed)) if v is not None}
    if overrides:
        from dataclasses import replace

        spec = replace(spec, **overrides)
    return AcceptOptions(args.target, dict(parse_arg(a) for a in args.arg), tuple(args.input), args.device,
                         args.reference, args.dtype, spec, args.allow_tf32, _perturb(args.perturb),
                         args.fail_on_lane, args.report,
                         tuple(dict.fromkeys(public_name(a) for a in args.public_arg)))


def _perturb(text: str | None) -> tuple[str, float] | None:
    if not text:
        return None
    name, _, eps = text.partition("=")
    try:
        value = float(eps) if eps else 1e-3
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"--perturb {text}: {eps!r} is not a number (a finite one) — write NAME or NAME=EPS, "
                         "e.g. fc.weight=1e-3") from None
    return name, value


def _render(result, fmt: str) -> str:
    from opscan.accept.package import comparison_data, verdict_data
    from opscan.accept.render import console

    if fmt == "json":
        data = {"verdict": verdict_data(result), "comparison": comparison_data(result)}
        data["comparison"].pop("comparisons")
        return strict_json(data, indent=2, default=str) + "\n"
    return console(result)


def _write_package(ctx: RunContext, result, out_dir: Path, log_text: str, cwd: str) -> None:
    from opscan.accept.package import build_package
    from opscan.accept.provenance import environment

    files = build_package(result, environment(result.options), log_text, cwd)
    write_whole(ctx, {out_dir / relative: content for relative, content in files.items()}, (out_dir / "rerun.sh",),
                root=out_dir)


def _configure_logging(quiet: int) -> io.StringIO:
    """stderr as the scan's, and a copy of every line for logs/accept.log."""
    captured = io.StringIO()
    form = logging.Formatter("opscan: %(message)s")
    stderr, copy = logging.StreamHandler(sys.stderr), logging.StreamHandler(captured)
    stderr.setFormatter(form)
    copy.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    stderr.setLevel(logging.INFO if quiet <= 0 else logging.WARNING if quiet == 1 else logging.ERROR)
    log.handlers[:] = [stderr, copy]
    log.propagate = False
    log.setLevel(logging.INFO)
    logging.captureWarnings(False)
    return captured


main = Command(build_parser, _run, logs=False).main  # `opscan accept`: main(argv, ctx=None) -> the exit code
