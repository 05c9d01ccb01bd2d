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
from opscan.trust.read import Malformed, json_value

PROBES_JOURNAL = "probes.jsonl"
VERSION = 1


class JournalError(OpscanError):
    """A journal that cannot be resumed (another plan, another version, unreadable)."""


def read_journal(path: Path, fingerprint: str) -> tuple[dict, dict, int]:
    """(outcomes keyed (probe, pass), environments by pass, byte length of the valid part). A torn last line
    (the run was killed mid-write) is dropped; any other line that is not a record is a JournalError naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JournalError(f"cannot read the journal {path}: {exc.strerror or exc} — drop --resume to start over")
    valid = data[: data.rfind(b"\n") + 1]
    done, envs = {}, {}
    for number, raw in enumerate(valid.splitlines(), 1):
        kind, entry = _record(raw, number, path)
        if number == 1:
            _check_header(kind, entry, fingerprint, path)
        elif kind == "environment" and isinstance(entry.get("pass"), str):
            envs[entry["pass"]] = entry.get("environment")
        elif kind == "outcome":
            try:
                outcome = PassOutcome.from_dict(entry)
            except (ProtocolError, TypeError, KeyError, ValueError) as exc:
                raise _damaged(path, number, f"not an outcome: {exc}") from None
            done[(outcome.probe, outcome.pass_name)] = outcome
        else:
            raise _damaged(path, number, f"an unknown record {str(kind)[:40]!r}")
    return done, envs, len(valid)


def _record(raw: bytes, number: int, path: Path) -> tuple[object, dict]:
    """(kind, the rest) of one journal line; a line that is not a JSON object is a JournalError."""
    try:
        entry = json_value(raw.decode("utf-8"))  # trust/read.py: a depth limit, a line for every problem
    except UnicodeDecodeError as exc:
        raise _damaged(path, number, f"not UTF-8 text, byte {exc.start}: {exc.reason}") from None
    except Malformed as exc:
        raise _damaged(path, number, str(exc)) from None
    if not isinstance(entry, dict):
        raise _damaged(path, number, "not a JSON object")
    return entry.pop("kind", None), entry


def _damaged(path: Path, number: int, why: str) -> JournalError:
    return JournalError(f"the journal {path} is damaged at line {number} ({why}) — delete it or drop --resume "
                        "to start over")


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
        self._failed = False
        resumed = resume and self.path.is_file() and self.path.stat().st_size
        if resumed:
            self.done, self.environments, size = read_journal(self.path, fingerprint)
        self._file = self._open(fresh=not resumed)
        if resumed:
            os.ftruncate(self._file.fileno(), size)
        else:
            self._write({"kind": "header", "journal": VERSION, "fingerprint": fingerprint, "device": device,
                         "probes": probes})

    def _open(self, fresh: bool):
        """The journal for appending, never through a link planted at its name (opscan/trust/output.py)."""
        from opscan.trust.output import open_append

        try:
            return os.fdopen(open_append(self.path, fresh), "a", encoding="utf-8")
        except OSError as exc:
            raise JournalError(f"cannot write the journal {self.path}: {exc.strerror or exc} — remove it, or pass -o "
                               "with a folder only you write to") from None

    def _write(self, entry: dict) -> None:
        try:
            self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._failed = True
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> JournalError:
        return JournalError(f"cannot write the journal {self.path}: {exc.strerror or exc} — free some space, then "
                            "rerun with --resume (the finished probes are kept)")

    def outcome(self, outcome: PassOutcome) -> None:
        """Record one finished pass of one probe."""
        self._write({"kind": "outcome", **outcome.to_dict()})

    def environment(self, pass_name: str, record: dict) -> None:
        """Record the environment of a pass's workers."""
        self._write({"kind": "environment", "pass": pass_name, "environment": record})

    def close(self) -> None:
        """Close the file (after a failed write, the line it could not write is dropped with it)."""
        try:
            self._file.close()
        except OSError as exc:
            if not self._failed:
                raise self._error(exc) from None
