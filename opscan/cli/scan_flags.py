"""CLI layer: the scan's flags — its parser (`opscan TARGET`, and `opscan bundle`, which takes the same flags) and
what they make: the ScanOptions, the live-memory options and the measured mode's probe options and session.
"""

from __future__ import annotations

import argparse
import sys

from opscan import __version__
from opscan.cli.command import output_folder
from opscan.cli.common import FORMAT_NAMES, VERDICT_NAMES
from opscan.cli.options import DEFAULT_STEP_TIMEOUT, Parser, count, env_flag, seconds
from opscan.target.run import RunContext

EPILOG = """\
exit codes: 0 nothing at or above --fail-on (default: findings never fail) · 1 findings at or above
--fail-on · 2 usage, target or environment error · 3 internal error (a bug in opscan: please report it)

subcommands (each with its own --help):
  opscan coverage [--torch-version X] [--diff A B]   the MPS knowledge base of a torch release
  opscan repro REPORT.json OP [--minimize]           standalone repro scripts and ISSUE.md for one finding
  opscan bundle TARGET [scan flags] -o DIR           the probes packed for a Mac you reach over SSH
  opscan merge RESULTS.jsonl [--bundle DIR]          fold a bundle's results into the measured report
  opscan accept TARGET [--device D]                  the real step on a device against the CPU reference
  opscan zoo MANIFEST|FAMILY [-o DIR] [--ray auto]    a leaderboard of many models over every release

TARGET: path/to/model.py:build_model or package.module:factory (e.g. torchvision.models:resnet18).
The factory returns an nn.Module or (model, example_inputs); the file may define example_inputs(),
train_step(model, optimizer, inputs), loss_fn(outputs, inputs) and build_optimizer(model).
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the source of --help)."""
    p = Parser(
        prog="opscan", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Does this model's whole training step run on Apple Silicon (MPS)? "
                    "Traces forward, loss, backward and optimizer step and predicts each aten op's verdict.",
    )
    p.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or package.module:FUNCTION")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE:DTYPE[:LOW-HIGH]",
                   help="random input tensor, repeatable (e.g. 1x3x224x224:float32, 8x128:int64:0-30522)")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the factory, repeatable (value parsed as a Python literal)")
    p.add_argument("--public-arg", action="append", default=[], metavar="KEY",
                   help="record this --arg's value in the report's command line and repro files (by default they "
                        "keep its name only: a value may be a credential)")
    p.add_argument("--inference", action="store_true", help="scan the forward only, under inference_mode")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), help="cast model and floating inputs")
    env_flag(p, "-f", "--format", env="OPSCAN_FORMAT", default="table", choices=FORMAT_NAMES,
             help="what to print on stdout (env OPSCAN_FORMAT; default table)")
    env_flag(p, "-o", "--output-dir", env="OPSCAN_OUTPUT_DIR",
             help="where report.json and report.yaml go (env OPSCAN_OUTPUT_DIR; default reports/<model>/)")
    env_flag(p, "--fail-on", env="OPSCAN_FAIL_ON", choices=VERDICT_NAMES,
             help="exit 1 when a row's verdict ranks at or above this one (env OPSCAN_FAIL_ON)")
    env_flag(p, "--baseline", env="OPSCAN_BASELINE", metavar="REPORT.JSON",
             help="fail only on rows new or worse than in this earlier report.json, from --fail-on "
                  "(default unknown) up (env OPSCAN_BASELINE)")
    p.add_argument("--tree", action="store_true", help="show the module tree with each module's worst verdict")
    p.add_argument("--no-fx", action="store_true", help="do not try torch.fx.symbolic_trace")
    p.add_argument("--no-repeat", action="store_true",
                   help="trace every layer of a stack of repeated layers (by default, with fake tensors, layers "
                        "3 .. N-2 of a stack proven to repeat are replicated from layer 2)")
    fake = p.add_mutually_exclusive_group()
    fake.add_argument("--fake", action="store_true",
                      help="build the model and inputs with fake tensors (no memory allocated); chosen by "
                           "itself when weights, grads and AdamW state would take over half the available RAM")
    fake.add_argument("--no-fake", action="store_true", help="always use real tensors (no meta-device pre-pass)")
    env_flag(p, "--torch-version", env="OPSCAN_TORCH_VERSION", metavar="X",
             help="predict for this torch release (2.0.0 … 2.14.1; default: the installed one); the step "
                  "is still traced with the installed torch (env OPSCAN_TORCH_VERSION)")
    env_flag(p, "--macos", env="OPSCAN_MACOS", metavar="V",
             help="assume this macOS version for macOS-gated facts (default: the release's minimum; "
                  "env OPSCAN_MACOS)")
    env_flag(p, "--chip", env="OPSCAN_CHIP", metavar="M",
             help="assume this Apple chip family (M1 … M5) for silent-bug entries limited to some chips (default: "
                  "any Apple Silicon: such entries are notes; env OPSCAN_CHIP)")
    env_flag(p, "--step-timeout", env="OPSCAN_STEP_TIMEOUT", default=DEFAULT_STEP_TIMEOUT, type=seconds,
             metavar="S", help="stop the target's code when one stage of it (import, factory, the traced step, a "
                               "memory run) runs longer than S seconds: exit 2 saying where it was (default "
                               f"{DEFAULT_STEP_TIMEOUT:g}; env OPSCAN_STEP_TIMEOUT)")
    _probe_flags(p)
    _memory_flags(p)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="list native rows too; on errors show the user's traceback")
    p.add_argument("-q", "--quiet", action="count", default=0, help="less on stderr")
    p.add_argument("--version", action="version", version=f"opscan {__version__}")
    return p


def _probe_flags(p: argparse.ArgumentParser) -> None:
    """Measured mode: --probe/--no-probe, --device, shape cap, resume, limits."""
    probe = p.add_mutually_exclusive_group()
    probe.add_argument("--probe", dest="probe", action="store_true", default=None,
                       help="measure every distinct call in isolated processes, fallback variable off and on "
                            "(default: on when MPS is available, or when --device is given)")
    probe.add_argument("--no-probe", dest="probe", action="store_false", help="predict only, never probe")
    env_flag(p, "--device", env="OPSCAN_DEVICE", choices=("cpu", "cuda", "mps"),
             help="where probes run (default mps); cpu and cuda measure that device and never stand in "
                  "for MPS; with --memory, where the live log runs (default cpu) (env OPSCAN_DEVICE)")
    env_flag(p, "--max-elements", env="OPSCAN_MAX_ELEMENTS", default=1 << 20, type=count(1), metavar="N",
             help="cap each probe tensor at N elements (1 or more), shrinking sizes consistently (default "
                  "1048576; env OPSCAN_MAX_ELEMENTS); --full-shapes for no cap")
    p.add_argument("--full-shapes", action="store_true", help="probe with the step's own shapes (no cap)")
    p.add_argument("--resume", action="store_true",
                   help="continue a killed measured run from <report folder>/probes.jsonl without redoing probes")
    p.add_argument("--probe-timeout", type=seconds, default=60.0, metavar="S",
                   help="limit per probe pass, seconds above zero (60 s)")
    p.add_argument("--workers", type=count(1), metavar="N",
                   help="probe processes per pass, 1 or more (default min(4, cores))")
    p.add_argument("--repro", action="store_true",
                   help="write a standalone repro script per finding call, and an ISSUE.md per finding worth "
                        "reporting to PyTorch, into <report folder>/repro/ (`opscan repro REPORT OP` makes them "
                        "later)")
    p.add_argument("--keep-paths", action="store_true",
                   help="keep absolute paths and user names in the repro files (default: file names relative to "
                        "the project, home folders as ~: they are meant for a public tracker)")


def _memory_flags(p: argparse.ArgumentParser) -> None:
    """Memory: the estimate and Mac sizing (on by default), and the live log of real iterations."""
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--memory", action="store_true",
                        help="also run a few real iterations on --device (default cpu) and log its memory per "
                             "phase and iteration, flagging growth (probes then run only with --probe)")
    memory.add_argument("--no-memory", action="store_true", help="skip the memory estimate and Mac sizing")
    env_flag(p, "--iterations", env="OPSCAN_ITERATIONS", default=5, type=count(3), metavar="N",
             help="iterations of the --memory live log, 3 or more (default 5; env OPSCAN_ITERATIONS)")


def scan_options(args, probe, live=None):
    """ScanOptions from the parsed scan flags, with these probe and live-memory options."""
    from opscan.scan import ScanOptions
    from opscan.target.inputs import parse_arg, public_name

    return ScanOptions(args.target, tuple(args.input), dict(parse_arg(a) for a in args.arg),
                       public_args=tuple(dict.fromkeys(public_name(a) for a in args.public_arg)),
                       inference=args.inference, dtype=args.dtype, fx=not args.no_fx, fake=args.fake,
                       auto_fake=not args.no_fake, torch_version=args.torch_version, macos=args.macos,
                       chip=args.chip, probe=probe,
                       memory=not args.no_memory, live=live, repro=args.repro, repeat=not args.no_repeat)


def live_options(args):
    """LiveOptions for --memory (None without it; --iterations is 3 or more: the live log needs them to judge
    growth, iteration 1 allocating the optimizer state)."""
    if not args.memory:
        return None
    from opscan.memory.live import LiveOptions

    return LiveOptions(device=args.device or "cpu", iterations=args.iterations, dtype=args.dtype,
                       inference=args.inference)


def probe_options(args, ctx=None):
    """(ProbeOptions or None, the journal/progress session) from the measured-mode flags (`ctx`: the run's
    RunContext, whose folders the journal's folder is made among; a fresh one when None)."""
    probing = args.probe
    if probing is None and args.memory:
        probing = False  # --device names where the live memory log runs
    if probing is None:
        probing = bool(args.device) or args.resume or _mps_available()
    if not probing:
        return None, None
    from opscan.probe.progress import Progress
    from opscan.probe.stage import ProbeOptions, ProbeSession, check_device

    check_device(args.device or "mps")  # before the trace: a device we cannot use is exit 2 at once
    fields = {"workers": args.workers} if args.workers else {}
    options = ProbeOptions(device=args.device or "mps", max_elements=None if args.full_shapes else args.max_elements,
                           timeout=args.probe_timeout, **fields)
    ctx = ctx or RunContext()
    folder = lambda name: output_folder(ctx, args, name)  # noqa: E731 - the journal's folder, claimed
    progress = Progress(sys.stderr, enabled=sys.stderr.isatty() and args.quiet == 0)
    return options, ProbeSession(folder, resume=args.resume, progress=progress)


def _mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


