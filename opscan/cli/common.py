"""CLI layer, shared: exit-code guard, output and logging, report files — what every subcommand uses.

Only the CLI layer writes files and prints the artefact; nothing outside opscan/cli imports it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

from opscan.errors import ExitCode, OpscanError, OutputError

log = logging.getLogger("opscan")
VERDICT_NAMES = ("native", "unknown", "cpu_fallback", "unsupported", "unsupported_dtype", "mismatch",
                 "error", "crash", "timeout")
FORMAT_NAMES = ("table", "json", "yaml", "html", "junit")


def run_guarded(body, verbose: int = 0) -> int:
    """Run one command's body and map what it raises to the documented exit codes: a user's error is one
    line and exit 2 (with `-v`, the user's own traceback), an interrupt exit 2, anything else is our bug
    (traceback, exit 3). Every subcommand's `main` goes through here."""
    try:
        return body()
    except OpscanError as exc:
        print(f"opscan: error: {exc}", file=sys.stderr)
        if verbose and exc.user_traceback:
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


def render(report, args, baseline=None) -> str:
    from opscan.render import FORMATS

    if args.format == "junit":
        return FORMATS["junit"](report, fail_on=args.fail_on, baseline=baseline)
    if args.format == "table":
        return FORMATS["table"](report, verbose=args.verbose > 0, tree=args.tree,
                                width=_width(), color=sys.stdout.isatty())
    return FORMATS[args.format](report)


def emit(text: str) -> None:
    """Print the artefact; a reader that stops early (`opscan ... | head`) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def write_reports(report, out_dir: Path, real_outputs: dict | None = None, device: str = "mps") -> None:
    """report.json/yaml/html, the GraphML files and repro/ (scripts for `device`; each ISSUE.md shows the real
    outputs, keyed by probe id, when given: `opscan merge`)."""
    from opscan.render import render_html, render_json, render_yaml
    from opscan.render.graphml import GRAPHML_FILES

    (out_dir / "report.json").write_text(render_json(report))
    (out_dir / "report.yaml").write_text(render_yaml(report))
    (out_dir / "report.html").write_text(render_html(report), encoding="utf-8")
    for name, render in GRAPHML_FILES.items():
        if report.step_graph is not None:
            (out_dir / name).write_text(render(report), encoding="utf-8")
    log.warning("wrote %s, report.yaml, report.html and the step graph (GraphML)", out_dir / "report.json")
    if report.repro is not None:
        from opscan.repro import render_files

        written = write_files(render_files(report.to_dict(), device=device, real_outputs=real_outputs), out_dir)
        log.warning("wrote %d repro files into %s", len(written), out_dir / "repro")


def check_writable(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".opscan-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"cannot write reports to {str(out_dir)!r}: {exc.strerror or exc} — pass -o with a writable folder"
        ) from None


def exit_code(report, fail_on: str | None, baseline=None) -> int:
    from opscan.render.gate import failures

    failing = failures(report.rows, fail_on, baseline)
    for i, why in list(failing.items())[:20]:
        row = report.rows[i]
        log.warning("fails: %s [%s] is %s (%s)", row.op.display, ",".join(row.dtypes), row.verdict.value, why)
    return ExitCode.FINDINGS if failing else ExitCode.OK


def configure_logging(level: int) -> None:
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


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write render_files' output under out_dir (scripts executable); the paths written."""
    written = []
    try:
        for rel, text in files.items():
            path = out_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if path.suffix == ".py":
                path.chmod(0o755)
            written.append(path)
    except OSError as exc:
        raise OutputError(f"cannot write repro files into {str(out_dir)!r}: {exc.strerror or exc} — pass -o with "
                          "a writable folder") from None
    return written
