"""CLI: parse flags, run the scan, print the chosen format, write the report files, map exit codes.

Thin on purpose: torch and every stage are imported lazily so `opscan --help` stays fast.
Only this module writes files.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path

from opscan import __version__
from opscan.errors import ExitCode, OpscanError, OutputError

log = logging.getLogger("opscan")
VERDICT_NAMES = ("native", "unknown", "cpu_fallback", "unsupported", "unsupported_dtype", "mismatch",
                 "error", "crash", "timeout")
FORMAT_NAMES = ("table", "json", "yaml")

EPILOG = """\
exit codes: 0 nothing at or above --fail-on (default: findings never fail) · 1 findings at or above
--fail-on · 2 usage, target or environment error · 3 internal error (a bug in opscan: please report it)

TARGET: path/to/model.py:build_model or package.module:factory (e.g. torchvision.models:resnet18).
The factory returns an nn.Module or (model, example_inputs); the file may define example_inputs(),
train_step(model, optimizer, inputs), loss_fn(outputs, inputs) and build_optimizer(model).
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the source of --help)."""
    p = argparse.ArgumentParser(
        prog="opscan", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Does this model's whole training step run on Apple Silicon (MPS)? "
                    "Traces forward, loss, backward and optimizer step and predicts each aten op's verdict.",
    )
    p.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or package.module:FUNCTION")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE:DTYPE[:LOW-HIGH]",
                   help="random input tensor, repeatable (e.g. 1x3x224x224:float32, 8x128:int64:0-30522)")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the factory, repeatable (value parsed as a Python literal)")
    p.add_argument("--inference", action="store_true", help="scan the forward only, under inference_mode")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), help="cast model and floating inputs")
    p.add_argument("-f", "--format", choices=FORMAT_NAMES, default=os.environ.get("OPSCAN_FORMAT", "table"),
                   help="what to print on stdout (env OPSCAN_FORMAT; default table)")
    p.add_argument("-o", "--output-dir", default=os.environ.get("OPSCAN_OUTPUT_DIR"),
                   help="where report.json and report.yaml go (env OPSCAN_OUTPUT_DIR; default reports/<model>/)")
    p.add_argument("--fail-on", choices=VERDICT_NAMES, default=os.environ.get("OPSCAN_FAIL_ON"),
                   help="exit 1 when a row's verdict ranks at or above this one (env OPSCAN_FAIL_ON)")
    p.add_argument("--tree", action="store_true", help="show the module tree with each module's worst verdict")
    p.add_argument("--no-fx", action="store_true", help="do not try torch.fx.symbolic_trace")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="list native rows too; on errors show the user's traceback")
    p.add_argument("-q", "--quiet", action="count", default=0, help="less on stderr")
    p.add_argument("--version", action="version", version=f"opscan {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (only __main__ calls sys.exit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version exit 0, usage errors exit 2
        return int(exc.code or 0)
    _configure_logging(args.verbose - args.quiet)
    try:
        return _run(args)
    except OpscanError as exc:
        print(f"opscan: error: {exc}", file=sys.stderr)
        if args.verbose and exc.user_traceback:
            print(exc.user_traceback, file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("opscan: interrupted", file=sys.stderr)
        return ExitCode.USAGE
    except Exception:  # noqa: BLE001 - anything else is our bug
        traceback.print_exc()
        print("opscan: internal error — this is a bug in opscan; please report it with the traceback above",
              file=sys.stderr)
        return ExitCode.INTERNAL


def _run(args: argparse.Namespace) -> int:
    from opscan.inputs import parse_arg, parse_input

    for text in args.input:
        parse_input(text)  # reject malformed --input before any slow import
    factory_args = dict(parse_arg(a) for a in args.arg)
    if args.output_dir:
        _check_writable(Path(args.output_dir))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log.info("tracing %s …", args.target)
    report = _scan(args, factory_args)
    out_dir = Path(args.output_dir or Path("reports") / _safe(report.model_name))
    _check_writable(out_dir)
    _write_reports(report, out_dir)
    _emit(_render(report, args))
    return _exit_code(report, args.fail_on)


def _scan(args, factory_args):
    from opscan.scan import ScanOptions, scan

    return scan(ScanOptions(args.target, tuple(args.input), factory_args, inference=args.inference,
                            dtype=args.dtype, fx=not args.no_fx))


def _render(report, args) -> str:
    from opscan.render import FORMATS

    if args.format == "table":
        return FORMATS["table"](report, verbose=args.verbose > 0, tree=args.tree,
                                width=_width(), color=sys.stdout.isatty())
    return FORMATS[args.format](report)


def _emit(text: str) -> None:
    """Print the artefact; a reader that stops early (`opscan ... | head`) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def _write_reports(report, out_dir: Path) -> None:
    from opscan.render import render_json, render_yaml

    (out_dir / "report.json").write_text(render_json(report))
    (out_dir / "report.yaml").write_text(render_yaml(report))
    log.warning("wrote %s and report.yaml", out_dir / "report.json")


def _check_writable(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".opscan-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"cannot write reports to {str(out_dir)!r}: {exc.strerror or exc} — pass -o with a writable folder"
        ) from None


def _exit_code(report, fail_on: str | None) -> int:
    if fail_on is None:
        return ExitCode.OK
    from opscan.verdict import Verdict

    threshold = Verdict(fail_on).rank
    return ExitCode.FINDINGS if any(r.verdict.rank >= threshold for r in report.rows) else ExitCode.OK


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("opscan: %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if level >= 0 else logging.WARNING if level == -1 else logging.ERROR)


def _width() -> int:
    try:
        return max(80, os.get_terminal_size(sys.stdout.fileno()).columns)
    except OSError:
        return 120


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"
