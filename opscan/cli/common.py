"""CLI layer, shared: exit-code guard, output and logging, report files — what every subcommand uses.

Only the CLI layer writes files and prints the artefact; nothing outside opscan/cli imports it. While a
command runs, stdout is redirected to stderr (Python's sys.stdout and file descriptor 1 both), so whatever
the target prints — at import, in its factory, in forward, from a C extension or a thread — cannot corrupt
`-f json`; `emit()` alone writes the artefact, to the real stdout. What a run keeps meanwhile (the real stdout,
the loggers to restore, the folders it made) is its RunContext's (opscan/target/run.py), passed as `ctx`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import traceback
from pathlib import Path

from opscan.cli.files import (is_open, output_error, prepare_folder, remove_created, remove_stale, stale_repro,
                              write_whole)
from opscan.errors import ExitCode, OpscanError, OutputError
from opscan.target.run import RunContext
from opscan.trust.names import inside
from opscan.trust.text import ascii_text, encodable, inert_commands, printable

log = logging.getLogger("opscan")
VERDICT_NAMES = ("native", "unknown", "cpu_fallback", "unsupported", "unsupported_dtype", "mismatch",
                 "error", "crash", "timeout")
FORMAT_NAMES = ("table", "json", "yaml", "html", "junit", "sarif", "github")
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def run_guarded(ctx: RunContext, body, verbose: int = 0) -> int:
    """Run one command's body and map what it raises to the documented exit codes: a user's error is one
    line and exit 2 (with `-v`, the user's own traceback), sys.exit() from the target's code and an interrupt
    exit 2, a full disk exit 2, anything else is our bug (traceback, exit 3). Every subcommand's `main` goes
    through here."""
    try:
        with artefact_stdout(ctx):
            return _mapped(ctx, body, verbose)
    finally:
        remove_created(ctx)  # folders made for a run that wrote nothing into them
        while ctx.restore:  # torch's log level, for a caller that runs more in this process
            logger, level = ctx.restore.pop()
            logger.setLevel(level)


def _mapped(ctx: RunContext, body, verbose: int) -> int:
    try:
        return body()
    except OpscanError as exc:
        return _user_error(str(exc), exc.user_traceback if verbose else None)
    except SystemExit as exc:  # opscan never calls sys.exit: the target's code did, outside a stage
        from opscan.target.user_code import exit_error

        error = exit_error(exc, ctx.current())
        return _user_error(str(error), error.user_traceback if verbose else None)
    except KeyboardInterrupt as exc:
        stage = exc.__dict__.get("opscan_stage")
        during = f" while {stage}" if stage else ""
        print(f"opscan: error: interrupted{during} — the run stopped there: rerun it (a measured run continues "
              "with --resume)", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            return _bug()
        return _user_error(str(output_error(exc, exc.filename or "a file")), None)
    except Exception:  # noqa: BLE001 - anything else is our bug
        return _bug()


def _user_error(line: str, user_traceback: str | None) -> int:
    print(f"opscan: error: {printable(line, newlines=False)}", file=sys.stderr)
    if user_traceback:
        print(user_traceback, file=sys.stderr)
    return ExitCode.USAGE


def _bug() -> int:
    traceback.print_exc()
    print("opscan: internal error — this is a bug in opscan; please report it with the traceback above",
          file=sys.stderr)
    return ExitCode.INTERNAL


@contextlib.contextmanager
def artefact_stdout(ctx: RunContext):
    """stdout (sys.stdout and descriptor 1) goes to stderr inside; emit() writes to the real one."""
    real = sys.stdout
    _flush(real)
    saved = _dup(1) if real is not None else None
    stream = _artefact_stream(real, saved)
    if is_open(2):
        os.dup2(2, 1)
    sys.stdout = sys.stderr
    ctx.artefact.append(stream)
    try:
        yield stream
    finally:
        ctx.artefact.pop()
        _flush(sys.stdout, stream)
        if not ctx.supervised:  # supervised, the child ends now: the target's threads keep only stderr to print to
            _restore(real, saved, stream)


def _restore(real, saved: int | None, stream) -> None:
    """stdout as it was before artefact_stdout."""
    if saved is not None:
        os.dup2(saved, 1)
        os.close(saved)
    if stream is not None and stream is not real:
        _close(stream)
    sys.stdout = real


def _artefact_stream(real, saved: int | None):
    """Where the artefact goes: a stream on the saved descriptor 1, or the replaced sys.stdout (a test's
    capture) when sys.stdout is not descriptor 1; None when stdout is closed."""
    if real is None:
        return None
    try:
        on_fd1 = real.fileno() == 1
    except (OSError, ValueError, AttributeError):
        on_fd1 = False
    if not on_fd1 or saved is None:
        return real
    return os.fdopen(os.dup(saved), "w", encoding=getattr(real, "encoding", None) or "utf-8",
                     errors=getattr(real, "errors", None) or "strict")


def artefact(ctx: RunContext):
    """The stream the artefact is written to (the real stdout), or None when stdout is closed."""
    return ctx.artefact[-1] if ctx.artefact else sys.stdout


def emit(ctx: RunContext, text: str, commands: bool = False) -> None:
    """Print the artefact; a reader that stops early (`opscan ... | head`) is not an error, a full or closed
    stdout is (exit 2). No line of it starts with `::` (a GitHub workflow command: trust/text.py inert_commands)
    unless `commands` (`-f github`, whose lines are workflow commands by design)."""
    text = text if commands else inert_commands(text)
    stream = artefact(ctx)
    if stream is None:
        raise OutputError("stdout is closed, so the output has nowhere to go — run opscan with stdout open "
                          "(e.g. > FILE)")
    if not encodable(text, getattr(stream, "encoding", None)):  # render() degraded its formats; this is the rest
        text = ascii_text(text)
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        _silence(stream)
    except OSError as exc:
        _silence(stream)
        raise OutputError(f"cannot write the output to stdout: {exc.strerror or exc} — free some space, or "
                          "send stdout elsewhere") from None


def _silence(stream) -> None:
    """No second error when the stream is flushed or closed later."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def render(ctx: RunContext, report, args, baseline=None) -> str:
    """The report in the chosen format, for the artefact stream: in ASCII when that stream cannot encode it
    (PYTHONIOENCODING=ascii, LC_ALL=C without UTF-8 mode), each format in its own way."""
    text = _rendered(ctx, report, args, baseline)
    encoding = getattr(artefact(ctx), "encoding", None)
    return text if encodable(text, encoding) else degraded(report, args.format, text)


def _rendered(ctx: RunContext, report, args, baseline=None) -> str:
    from opscan.render import FORMATS

    if args.format == "junit":
        return FORMATS["junit"](report, fail_on=args.fail_on, baseline=baseline)
    if args.format == "table":
        out = artefact(ctx)
        return FORMATS["table"](report, verbose=args.verbose > 0, tree=args.tree,
                                width=_width(out), color=_isatty(out))
    return FORMATS[args.format](report)


def degraded(report, fmt: str, text: str) -> str:
    """`text` (the report rendered as `fmt`) in ASCII that means the same: YAML re-dumped with escapes, XML and
    HTML with character references, JSON is ASCII already, the table with ASCII spellings."""
    if fmt == "yaml":
        from opscan.render.structured import render_yaml

        return render_yaml(report, ascii_only=True)
    if fmt in ("junit", "html"):
        return text.encode("ascii", "xmlcharrefreplace").decode("ascii")
    return ascii_text(text)


def write_reports(ctx: RunContext, report, out_dir: Path, real_outputs: dict | None = None,
                  device: str = "mps", keep_paths: bool = False) -> None:
    """report.json/yaml/html, the GraphML files and repro/ (scripts for `device`; each ISSUE.md shows the real
    outputs, keyed by probe id, when given: `opscan merge`; paths redacted unless `keep_paths`) — all written
    whole, or none."""
    from opscan.render import render_html, render_json, render_yaml
    from opscan.render.graphml import CALLS_NAMES, graphml_files

    files = {out_dir / "report.json": render_json(report), out_dir / "report.yaml": render_yaml(report),
             out_dir / "report.html": render_html(report)}
    graphs = graphml_files(report)
    files.update({out_dir / name: content for name, content in graphs.items()})
    repro = {}
    if report.repro is not None:
        from opscan.repro import render_files

        rendered = render_files(report.to_dict(), device=device, real_outputs=real_outputs, keep_paths=keep_paths)
        repro = {inside(out_dir, rel): text for rel, text in rendered.items()}
    stale = stale_repro(out_dir, set(repro))
    write_whole(ctx, {**files, **repro}, tuple(p for p in repro if p.suffix == ".py"), root=out_dir)
    remove_stale(stale, out_dir / "repro")
    for name in CALLS_NAMES if graphs else ():  # an earlier run's graph.graphml(.gz) of the other kind
        if name not in graphs:
            try:
                (out_dir / name).unlink(missing_ok=True)
            except OSError:  # not ours to insist on: the report's graph.files names the current one
                pass
    log.warning("wrote %s, report.yaml, report.html and the step graph (GraphML)", out_dir / "report.json")
    if repro:
        log.warning("wrote %d repro files into %s", len(repro), out_dir / "repro")


def check_writable(ctx: RunContext, out_dir: Path) -> None:
    """Create the folder (removed again if the run writes nothing into it) and check that it is writable."""
    prepare_folder(ctx, out_dir)


def exit_code(report, fail_on: str | None, baseline=None) -> int:
    from opscan.render.gate import code_failures, failures
    from opscan.report.where import at_text

    failing = failures(report.rows, fail_on, baseline)
    for i, why in list(failing.items())[:20]:
        row = report.rows[i]
        log.warning("fails: %s [%s] is %s (%s)", row.op.display, ",".join(row.dtypes), row.verdict.value, why)
    code = code_failures(report.findings, fail_on, baseline)  # lines of code no row holds (device code)
    for i, why in list(code.items())[:20]:
        found = report.findings[i]
        log.warning("fails: %s at %s is %s (%s)", found.summary(), at_text(found.site) or "(no line)",
                    found.verdict.value, why)
    return ExitCode.FINDINGS if failing or code else ExitCode.OK


def configure_logging(level: int) -> None:
    """opscan's logger to stderr at -v/-q's level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Printable("opscan: %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if level >= 0 else logging.WARNING if level == -1 else logging.ERROR)


class _Printable(logging.Formatter):
    """opscan's log lines with control characters and terminal escape sequences (a module or model name, an
    exception text from a Mac) as visible escapes (opscan/trust/text.py); each value in a line stays on it (its
    line breaks escaped too), so no value starts a line of its own (a GitHub workflow command)."""

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.args, tuple) and record.args:
            record = logging.makeLogRecord({**record.__dict__, "args": tuple(
                printable(a, newlines=False) if isinstance(a, (str, os.PathLike)) else a for a in record.args)})
        return inert_commands(printable(super().format(record)))


def quiet_torch_logs(ctx: RunContext, verbose: int) -> None:
    """Keep torch's own loggers (the fake-tensor logger's tracebacks, ...) off the terminal unless -v or
    TORCH_LOGS asks for them. torch configures its loggers when imported, so this imports it first."""
    if verbose > 0 or os.environ.get("TORCH_LOGS"):
        return
    import torch  # noqa: F401 - its logging is set up on import; the level below must come after

    torch_log = logging.getLogger("torch")
    ctx.restore.append((torch_log, torch_log.level))
    torch_log.setLevel(logging.CRITICAL + 1)


MIN_WIDTH, PIPED_WIDTH = 40, 120


def _width(stream) -> int:
    """The table's width: COLUMNS when set (piped output and CI too), else the terminal's, else 120."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    try:
        return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        return PIPED_WIDTH


def _isatty(stream) -> bool:
    """Colour: never with NO_COLOR set (no-color.org), always with FORCE_COLOR set (piped output and CI too), else
    on a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


def _flush(*streams) -> None:
    for stream in streams:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _close(stream) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.close()


def _dup(fd: int) -> int | None:
    try:
        return os.dup(fd)
    except OSError:
        return None

