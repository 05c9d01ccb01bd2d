"""CLI: `opscan zoo MANIFEST|FAMILY` — a leaderboard of many models over every release; `opscan zoo diff OLD NEW`.

The scan of each model runs in a worker (the local pool, or Ray tasks with --ray); this module picks the models,
keeps the journal (`zoo.jsonl`, a line per finished model, flushed and fsynced as results arrive, so a rerun with
the same -o skips them), draws the progress on stderr and writes leaderboard.json/.csv/.html at the end. stdout
carries only what -f asks for (default: nothing). Exit codes: 0 every model scanned, 1 some models are error
rows (the leaderboard is written all the same), 2 usage, manifest or environment error, 3 a bug in opscan.
`opscan zoo diff`: 0 no lane changed, 1 some lanes changed, 2 a file that is not a leaderboard.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import os
import sys
from pathlib import Path

from opscan.cli.command import Command
from opscan.cli.common import emit
from opscan.cli.files import output_error, prepare_folder, write_whole
from opscan.cli.options import Parser, count, seconds
from opscan.errors import ExitCode, UsageError
from opscan.target.run import RunContext
from opscan.trust.names import safe_name
from opscan.trust.text import strict_json

log = logging.getLogger("opscan")
DEFAULT_TIMEOUT = 900.0
OUTPUTS = ("leaderboard.json", "leaderboard.csv", "leaderboard.html")


def build_parser() -> argparse.ArgumentParser:
    """The `opscan zoo` parser."""
    p = Parser(prog="opscan zoo", description="Scan a family of models (torchvision, timm, transformers) or a "
               "YAML manifest for every torch release and write a leaderboard (HTML, JSON, CSV). "
               "`opscan zoo diff OLD.json NEW.json` lists the lanes that changed between two leaderboards.")
    p.add_argument("source", metavar="MANIFEST|FAMILY", help="torchvision, timm, transformers, or a manifest .yaml")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="leaderboard and journal folder (default reports/zoo-NAME)")
    p.add_argument("--releases", metavar="R[,R...]", help="these releases only (default: every release opscan knows)")
    p.add_argument("--workers", type=count(), default=os.cpu_count() or 1, metavar="N",
                   help="local worker processes (default: one per core)")
    p.add_argument("--ray", metavar="auto|ADDRESS", help="run the models as Ray tasks (pip install 'opscan[ray]')")
    p.add_argument("--limit", type=count(), metavar="N", help="the first N models (after --match)")
    p.add_argument("--match", action="append", default=[], metavar="GLOB",
                   help="models whose name matches (repeatable)")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"limit per model; past it the model is an error row (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("-f", "--format", choices=("none", "json", "csv"), default="none", help="what to print on stdout")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="count", default=0)
    return p


def diff_parser() -> argparse.ArgumentParser:
    p = Parser(prog="opscan zoo diff", description="The models whose lane changed between two leaderboards "
               "(per release), and the blocking rows that appeared or disappeared.")
    p.add_argument("old", metavar="OLD.json")
    p.add_argument("new", metavar="NEW.json")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text")
    return p


def main(argv: list[str], ctx: RunContext | None = None) -> int:
    """`opscan zoo` (or `opscan zoo diff`); returns the exit code."""
    if argv and argv[0] == "diff":
        return Command(diff_parser, _diff, prepare=False).main(argv[1:], ctx)
    return Command(build_parser, _zoo, prepare=False).main(argv, ctx)


def _diff(args, ctx: RunContext) -> int:
    from opscan.trust.text import printable
    from opscan.zoo.outputs import diff, render_diff

    old, new = _board(Path(args.old)), _board(Path(args.new))
    found = diff(old, new)
    text = printable(render_diff(found)) if args.format == "text" else strict_json(found.to_dict(), indent=1) + "\n"
    emit(ctx, text)  # the leaderboards are files from elsewhere: their names print with escapes, never raw
    return ExitCode.FINDINGS if found.changes else ExitCode.OK


def _board(path: Path):
    from opscan.trust.read import read_json
    from opscan.zoo.board import Leaderboard

    data = read_json(path, "the leaderboard", "pass the leaderboard.json `opscan zoo` wrote",
                     expected="a leaderboard.json")
    return Leaderboard.from_dict(data, str(path))


def _zoo(args, ctx: RunContext) -> int:
    from opscan.zoo import journal
    from opscan.zoo.board import make_board

    title, models = _models(args)
    releases = _releases(args.releases)
    out_dir = Path(args.output_dir or Path("reports") / f"zoo-{safe_name(title)}")
    prepare_folder(ctx, out_dir)
    path = out_dir / journal.JOURNAL_NAME
    done, valid = journal.read(path, releases)
    results = {m.key: done[m.key] for m in models if m.key in done}
    todo = [m for m in models if m.key not in done]
    log.info("zoo %s: %d models x %d releases, %d already in %s, %d to scan", title, len(models), len(releases),
             len(results), path, len(todo))
    with _Journal(path, valid, journal.header(title, releases)) as sink, _progress(args, len(models)) as bar:
        bar.advance(len(results))

        def on_result(result: dict) -> None:
            key = _key_of(result)
            sink.write(journal.model_line(key, result))
            results[key] = result
            bar.advance(1, result)

        _engine(args, todo, releases, on_result)
    from opscan.zoo.board import ModelResult

    board = make_board(title, releases, [ModelResult.from_dict(r) for r in results.values()])
    _write(ctx, board, out_dir)
    _print(ctx, board, args.format)
    return ExitCode.FINDINGS if board.counts()["errors"] else ExitCode.OK


def _key_of(result: dict) -> str:
    from opscan.zoo.models import ZooModel

    return ZooModel.from_dict(result["model"]).key


def _models(args):
    from opscan.zoo.families import FAMILIES, family
    from opscan.zoo.models import read_manifest

    source = args.source
    if source in FAMILIES:
        title, models = source, family(source)
    elif Path(source).suffix in (".yaml", ".yml") or Path(source).is_file():
        title, models = Path(source).stem, read_manifest(Path(source))
    else:
        raise UsageError(f"{source!r} is neither a family ({', '.join(FAMILIES)}) nor a manifest file (.yaml)")
    if args.match:
        models = tuple(m for m in models if any(fnmatch.fnmatchcase(m.name, g) for g in args.match))
    models = models[: args.limit] if args.limit else models
    if not models:
        raise UsageError(f"no model of {source} matches --match {' '.join(args.match)}")
    return title, models


def _releases(text: str | None) -> tuple[str, ...]:
    from opscan.knowledge import kb_releases
    from opscan.opkey import Release

    known = kb_releases()
    if not text:
        return tuple(sorted(known, key=Release.parse))
    chosen = tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    unknown = [r for r in chosen if r not in known]
    if unknown or not chosen:
        raise UsageError(f"--releases: {', '.join(unknown) or 'none given'} — opscan knows {known[0]} … {known[-1]} "
                         f"({len(known)} releases: see `opscan coverage`)")
    return tuple(sorted(chosen, key=Release.parse))


def _engine(args, todo, releases, on_result) -> None:
    if not todo:
        return
    if args.ray:
        from opscan.zoo.ray_run import run_ray

        run_ray(todo, releases, args.ray, args.timeout, on_result)
    else:
        from opscan.zoo.pool import LocalPool

        LocalPool(args.workers, args.timeout, releases).run(todo, on_result)


def _write(ctx: RunContext, board, out_dir: Path) -> None:
    from opscan.zoo.html import render_html
    from opscan.zoo.outputs import render_csv, render_json

    texts = (render_json(board), render_csv(board), render_html(board))
    write_whole(ctx, {out_dir / name: text for name, text in zip(OUTPUTS, texts)}, root=out_dir)
    counts = board.counts()
    log.warning("wrote %s (and .csv, .html): %d models, %d could not be scanned; %d cells, %d predicted, "
                "%d measured", out_dir / OUTPUTS[0], counts["models"], counts["errors"], counts["cells"],
                counts["predicted"], counts["measured"])


def _print(ctx: RunContext, board, fmt: str) -> None:
    from opscan.zoo.outputs import render_csv, render_json

    if fmt != "none":
        emit(ctx, render_json(board) if fmt == "json" else render_csv(board))


class _Journal:
    """The journal file, opened for appending after its valid part; each line flushed and fsynced."""

    def __init__(self, path: Path, valid: int, header: dict):
        self.path, self.valid, self.header = path, valid, header

    def __enter__(self):
        from opscan.zoo.journal import line

        from opscan.trust.output import open_append

        try:  # never through a link planted at the journal's name (opscan/trust/output.py)
            self.file = os.fdopen(open_append(self.path, fresh=False), "ab")
        except OSError as exc:
            raise output_error(exc, self.path) from None
        self.file.truncate(self.valid)  # drop a torn last line
        if self.valid == 0:
            self.write(line(self.header))
        return self

    def write(self, text: str) -> None:
        self.file.write(text.encode("utf-8"))
        self.file.flush()
        os.fsync(self.file.fileno())

    def __exit__(self, *exc):
        self.file.close()
        return False


class _progress:
    """rich's progress bar on stderr (nothing with -q); each error row is also a log line."""

    def __init__(self, args, total: int):
        self.args, self.total = args, total

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("zoo"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=Console(file=sys.stderr),
                            disable=self.args.quiet > 0)
        self.bar.start()
        self.task = self.bar.add_task("", total=self.total)
        return self

    def advance(self, n: int, result: dict | None = None) -> None:
        from rich.markup import escape as markup_escape

        from opscan.trust.text import printable

        if result is not None:
            name = result["model"]["name"]
            if result.get("error"):
                log.warning("%s: %s", name, result["error"])
            self.bar.update(self.task, description=markup_escape(printable(f"{name} ({result['seconds']:.0f} s)",
                                                                          newlines=False)))
        self.bar.advance(self.task, n)

    def __exit__(self, *exc):
        self.bar.stop()
        return False
