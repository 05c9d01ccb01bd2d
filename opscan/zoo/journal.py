"""The zoo's journal: `<output folder>/zoo.jsonl`, one JSON line per finished model, so a killed run resumes.

    {"kind": "header", "journal": 1, "title": "torchvision", "releases": ["2.0.0", ...]}
    {"kind": "model", "key": "resnet18#3f1c...", "result": {...ModelResult.to_dict()...}}

The CLI appends a line as each result arrives (flushed and fsynced). A rerun with the same output folder reads
it back: a torn last line (the kill came mid-write) is dropped, every finished model (same name and spec, see
ZooModel.key) is kept and not scanned again. A journal written for other releases is not mixed in: one line
says so (exit 2). This module only reads; the CLI writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opscan.errors import UsageError

JOURNAL_NAME = "zoo.jsonl"
VERSION = 1


def header(title: str, releases: tuple[str, ...]) -> dict[str, Any]:
    return {"kind": "header", "journal": VERSION, "title": title, "releases": list(releases)}


def line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True) + "\n"


def model_line(key: str, result: dict[str, Any]) -> str:
    return line({"kind": "model", "key": key, "result": result})


def read(path: Path, releases: tuple[str, ...]) -> tuple[dict[str, dict], int]:
    """({model key: result dict} of the journal at `path`, byte length of its valid part); ({}, 0) when absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, 0
    except OSError as exc:
        raise UsageError(f"cannot read the zoo journal {path}: {exc.strerror or exc}") from None
    valid = data[: data.rfind(b"\n") + 1]  # a torn last line is dropped
    records = []
    for number, raw in enumerate(valid.splitlines(), 1):
        try:
            records.append(json.loads(raw))
        except ValueError:
            raise UsageError(f"zoo journal {path}, line {number}: not JSON — remove the file (or use another "
                             "-o) to start over") from None
    if not records:
        return {}, len(valid)
    first = records[0]
    if first.get("kind") != "header" or first.get("journal") != VERSION:
        raise UsageError(f"{path} is not a zoo journal of version {VERSION} — remove it or use another -o")
    if list(first.get("releases", [])) != list(releases):
        raise UsageError(f"zoo journal {path} was written for releases {', '.join(first.get('releases', []))}; "
                         "rerun with those --releases, or use another -o to scan these")
    done = {r["key"]: r["result"] for r in records[1:] if r.get("kind") == "model"}
    return done, len(valid)
