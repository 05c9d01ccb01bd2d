"""Probe stage: the journal — every pass outcome, one JSON line each, written as it arrives.

`<report folder>/probes.jsonl` (with `probes.log`, the workers' stderr, the only files the probe stage
writes; reporters write none):

    {"kind": "header", "journal": 1, "fingerprint": "...", "device": "cpu", "probes": 251}
    {"kind": "environment", "pass": "off", "environment": {...}}
    {"kind": "outcome", "probe": "...", "pass_name": "off", "status": "ran", ...}   (PassOutcome.to_dict)

Each line is flushed before the next probe is reported, so a killed run loses at most the line it
was writing. `--resume` reads the journal of the same plan (same fingerprint), drops a torn last
line, keeps every finished outcome and appends the rest: no probe runs twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from opscan.errors import OpscanError
from opscan.probe.protocol import PassOutcome, ProtocolError

JOURNAL_NAME = "probes.jsonl"
VERSION = 1


class JournalError(OpscanError):
    """A journal that cannot be resumed (another plan, another version, unreadable)."""


def read(path: Path, fingerprint: str) -> tuple[dict, dict, int]:
    """(outcomes keyed (probe, pass), environments by pass, byte length of the valid part)."""
    data = path.read_bytes()
    valid = data[: data.rfind(b"\n") + 1]  # a torn last line (the run was killed mid-write) is dropped
    done, envs = {}, {}
    for number, raw in enumerate(valid.splitlines(), 1):
        entry = json.loads(raw)
        kind = entry.pop("kind", None)
        if number == 1:
            _check_header(kind, entry, fingerprint, path)
        elif kind == "environment":
            envs[entry["pass"]] = entry["environment"]
        elif kind == "outcome":
            try:
                outcome = PassOutcome.from_dict(entry)
            except (ProtocolError, TypeError) as exc:
                raise JournalError(f"{path}: line {number} is not an outcome ({exc}) — delete it to start over")
            done[(outcome.probe, outcome.pass_name)] = outcome
    return done, envs, len(valid)


def _check_header(kind, entry: dict, fingerprint: str, path: Path) -> None:
    if kind != "header" or entry.get("journal") != VERSION:
        raise JournalError(f"{path} is not an opscan probe journal (version {VERSION}) — delete it or drop --resume")
    if entry.get("fingerprint") != fingerprint:
        raise JournalError(f"{path} belongs to another probe plan (other model, device, shapes or torch) — "
                           "drop --resume to start over")


class Journal:
    """Appends outcomes and environment records to the journal file."""

    def __init__(self, path: Path, fingerprint: str, device: str, probes: int, resume: bool):
        self.path = Path(path)
        self.done, self.environments = {}, {}
        if resume and self.path.is_file() and self.path.stat().st_size:
            self.done, self.environments, size = read(self.path, fingerprint)
            with open(self.path, "r+b") as f:
                f.truncate(size)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            self._write({"kind": "header", "journal": VERSION, "fingerprint": fingerprint, "device": device,
                         "probes": probes})

    def _write(self, entry: dict) -> None:
        self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def outcome(self, outcome: PassOutcome) -> None:
        """Record one finished pass of one probe."""
        self._write({"kind": "outcome", **outcome.to_dict()})

    def environment(self, pass_name: str, record: dict) -> None:
        """Record the environment of a pass's workers."""
        self._write({"kind": "environment", "pass": pass_name, "environment": record})

    def close(self) -> None:
        """Close the file."""
        self._file.close()
