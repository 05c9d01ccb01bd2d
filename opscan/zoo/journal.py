"""The zoo's journal: `<output folder>/zoo.jsonl`, one JSON line per finished model, so a killed run resumes.

    {"kind": "header", "journal": 1, "title": "torchvision", "releases": ["2.0.0", ...]}
    {"kind": "model", "key": "resnet18#3f1c...", "result": {...ModelResult.to_dict()...}}

The CLI appends a line as each result arrives (flushed and fsynced). A rerun with the same output folder reads
it back: a torn last line (the kill came mid-write) is dropped, every finished model (same name and spec, see
ZooModel.key) is kept and not scanned again. A journal written for other releases is not mixed in: one line
says so (exit 2), as does a line that is not JSON at all or a missing header, and a damaged line (issue 36): JSON
but not a model result (no `key`, a list, an unknown kind, a result the leaderboard cannot read) is exit 2 naming
its line and why — opscan never writes one, so the file was edited or damaged: delete that line (its model is
scanned again) or the file. It is checked here, before any model is scanned, never when the leaderboard is built.
Lines go through the one reader's limits (opscan/trust/read.py). This module only reads; the CLI writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opscan.errors import UsageError
from opscan.trust.read import Malformed, json_value, read_bytes
from opscan.trust.text import printable, strict_json

JOURNAL_NAME = "zoo.jsonl"
VERSION = 1


def header(title: str, releases: tuple[str, ...]) -> dict[str, Any]:
    return {"kind": "header", "journal": VERSION, "title": title, "releases": list(releases)}


def line(record: dict[str, Any]) -> str:
    return strict_json(record, sort_keys=True) + "\n"


def model_line(key: str, result: dict[str, Any]) -> str:
    return line({"kind": "model", "key": key, "result": result})


def read(path: Path, releases: tuple[str, ...]) -> tuple[dict[str, dict], int]:
    """({model key: result dict} of the journal at `path`, byte length of its valid part); ({}, 0) when absent."""
    if not path.exists():
        return {}, 0
    data = read_bytes(path, "the zoo journal", "remove it (or use another -o) to start over")
    valid = data[: data.rfind(b"\n") + 1]  # a torn last line is dropped
    records = []
    for number, raw in enumerate(valid.splitlines(), 1):
        try:
            records.append(json_value(raw))
        except Malformed as exc:
            raise UsageError(f"zoo journal {path}, line {number}: not JSON ({exc}) — remove the file (or use "
                             "another -o) to start over") from None
    if not records:
        return {}, len(valid)
    first = records[0]
    if not isinstance(first, dict) or first.get("kind") != "header" or first.get("journal") != VERSION:
        raise UsageError(f"{path} is not a zoo journal of version {VERSION} — remove it or use another -o")
    written = first.get("releases")
    if not isinstance(written, list) or written != list(releases):
        shown = ", ".join(map(str, written)) if isinstance(written, list) else repr(written)
        raise UsageError(f"zoo journal {path} was written for releases {shown}; rerun with those --releases, or "
                         "use another -o to scan these")
    return _models(path, records, tuple(releases)), len(valid)


def _models(path: Path, records: list, releases: tuple[str, ...]) -> dict[str, dict]:
    """{key: result} of the model lines; UsageError (exit 2) naming the first damaged line and why."""
    done = {}
    for number, record in enumerate(records[1:], 2):
        why = _not_a_model_line(record, releases)
        if why:
            raise UsageError(f"zoo journal {path}, line {number}: {why} — delete that line (its model is scanned "
                             "again) or the file (or use another -o) to start over")
        done[record["key"]] = record["result"]
    return done


def _not_a_model_line(record, releases: tuple[str, ...]) -> str | None:
    """Why a journal line after the header cannot be used (None: it can, or it is another kind of line): a model
    line must give a leaderboard row that renders, as the end of the run will render it."""
    from opscan.zoo.board import ModelResult, make_board
    from opscan.zoo.html import render_html
    from opscan.zoo.outputs import render_csv, render_json

    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    if record.get("kind") != "model":
        kind = record.get("kind")
        return f"an unknown kind of record ({printable(repr(kind)[:40])})" if isinstance(kind, str) else \
            "a record without a kind"
    if not isinstance(record.get("key"), str):
        return "a model line without its key"
    try:
        result = ModelResult.from_dict(record.get("result"))
        if not all(isinstance(v, str) for v in (result.model.name, result.model.target)):
            raise TypeError("its model's name or target is not text")
        board = make_board("check", releases, [result])
        render_json(board), render_csv(board), render_html(board)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"not a model result ({type(exc).__name__}: {str(exc)[:80]})"
    if result.model.key != record["key"]:
        return "a result of another model than its key says"
    return None
