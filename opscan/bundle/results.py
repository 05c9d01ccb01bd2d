"""Bundle: the results journal a bundle's run writes on the Mac, and its validation before a merge.

`results/results.jsonl`, one JSON object a line, each flushed and fsynced as it is written:

    {"kind": "header", "journal": 1, "results": 1, "bundle": HASH, "fingerprint": FP, "device": "mps", ...}
    {"kind": "runner", ...}        every start of run.sh: the runner's modules (all from the bundle's src/)
    {"kind": "host", "files": {}}  the environment run.sh recorded in results/env/ (first start only)
    {"kind": "environment", "pass": "off", "environment": {...}}      a pass's worker record
    {"kind": "outcome", ...}       one PassOutcome per probe and pass, as they arrive
    {"kind": "repro", "script": "repro/...", "probe": ID, "exit_code": 0, "output": "...", "environment": {...}}
    {"kind": "end", "counts": {...}, "digest": "<sha256 of every byte before this line>"}

A killed run leaves no `end` line (and maybe a torn last line); rerunning run.sh drops the torn line,
keeps every finished outcome and appends the rest. Stdlib only: vendored into every bundle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from opscan.errors import OpscanError
from opscan.probe.protocol import PassOutcome, ProtocolError

VERSION = 1
AGAIN = "copy results/results.jsonl from the Mac again, or rerun ./run.sh there (it resumes)"


class ResultsError(OpscanError):
    """A results file that cannot be merged: corrupted, foreign, tampered or truncated."""


def digest(data: bytes) -> str:
    """sha256 hex of bytes (the `end` line's digest, file hashes)."""
    return hashlib.sha256(data).hexdigest()


def bundle_hash(manifest: dict) -> str:
    """The bundle's identity: sha256 of its canonical manifest (every field but `bundle_hash`: the scan flags,
    device, runner options, repro list, fingerprint and the sha256 of every other file)."""
    body = {k: v for k, v in manifest.items() if k != "bundle_hash"}
    return digest(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())


def bundle_problem(folder: Path, manifest: dict) -> str | None:
    """What makes a bundle folder differ from its manifest (None when it matches): the manifest's own hash,
    then every file it lists (run.sh, README.txt, probes.jsonl, src/, repro/), byte for byte."""
    if not isinstance(manifest.get("files"), dict) or bundle_hash(manifest) != manifest.get("bundle_hash"):
        return "manifest.json does not match its bundle_hash"
    for rel, sha in sorted(manifest["files"].items()):
        if _outside(rel):
            return f"manifest.json lists {str(rel)[:80]!r}, not a file inside the bundle"
        path = Path(folder) / rel
        if not path.is_file() or digest(path.read_bytes()) != sha:
            return f"{rel} differs from the bundle's manifest"
    return None


def _outside(rel) -> bool:
    """Whether a file the manifest lists is not a plain relative path inside the bundle (`..`, absolute, ...)."""
    if not isinstance(rel, str) or "\\" in rel or PurePosixPath(rel).is_absolute():
        return True
    parts = PurePosixPath(rel).parts
    return not parts or any(p in ("", ".", "..") for p in parts)


def parse_lines(data: bytes, parse=json.loads, why: list | None = None) -> tuple[list[dict], int, int | None]:
    """(entries of the complete lines, byte length of the part read, number of the first bad line or None);
    `parse`: one line's JSON (merge passes the one reader's, opscan/trust/read.py json_value, with its limits);
    `why`, when given, gets what is wrong with the bad line.

    A last line without its newline (the run was killed mid-write) is torn: left out, not bad."""
    valid = data[: data.rfind(b"\n") + 1]
    entries: list[dict] = []
    for number, raw in enumerate(valid.splitlines(), 1):
        try:
            entry = parse(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, the reader's Malformed
            (why if why is not None else []).append(str(exc)[:200])
            return entries, len(valid), number
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
            (why if why is not None else []).append("not a record with a kind")
            return entries, len(valid), number
        entries.append(entry)
    return entries, len(valid), None


def needed(probes, off: dict, on_pass: str) -> set[tuple[str, str]]:
    """The (probe id, pass) pairs a finished run holds: every off pass, and the on passes the runner runs."""
    pairs = {(p.id, "off") for p in probes}
    for p in probes:
        status = off[p.id].status if p.id in off else None
        if status == "raised" or (on_pass == "always" and status not in (None, "unbuildable")):  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
            pairs.add((p.id, "on"))
    return pairs


# what merge reads of each kind of line, and the types it needs (None: the field may be null or absent)
SHAPES = {"header": {"workers": (int, None), "timeout_s": (int, float), "isolation": (str,), "on_pass": (str,)},
          "environment": {"environment": (dict, None)}, "host": {"files": (dict, None)},
          "repro": {"script": (str,), "probe": (str, None), "output": (str, None), "exit_code": (int, None),
                    "device": (str, None), "environment": (dict, None)}}


def _misshapen(entry: dict) -> str | None:
    """'field X of type T' when a line merge reads lacks a field it needs or has one of the wrong type."""
    for field, types in SHAPES.get(entry.get("kind"), {}).items():
        value = entry.get(field)
        if not (value is None and None in types) and (isinstance(value, bool) or not isinstance(
                value, tuple(t for t in types if t is not None))):
            return f"a field {field!r} of type {type(value).__name__}"
    return None


@dataclass(frozen=True)
class Results:
    """A validated results file: outcomes keyed (probe, pass), pass environments, host files, repro runs."""

    header: dict
    outcomes: dict
    environments: dict
    host: dict
    repro: dict  # script path -> its repro line
    end: dict


def load(path: Path, bundle: str, probes, on_pass: str) -> Results:
    """Read and validate a finished results file of the bundle whose hash is `bundle`; ResultsError if not.
    Merge only (the Mac never reads a results file it did not write): the one reader's limits apply."""
    from opscan.trust.read import json_value, read_bytes

    data = read_bytes(path, "results file", "pass results/results.jsonl as the bundle's run.sh wrote it",
                      error=ResultsError)
    why: list[str] = []
    entries, size, bad = parse_lines(data, json_value, why)
    if bad is not None:
        raise ResultsError(f"corrupted results file {path}: line {bad} is not a JSON record ({why[0]}) — {AGAIN}")
    header = entries[0] if entries else {}
    if header.get("kind") != "header" or header.get("results") != VERSION:
        raise ResultsError(f"corrupted results file {path}: it does not start with an opscan results header "
                           f"(version {VERSION}) — pass the results/results.jsonl a bundle's run.sh wrote")
    if header.get("bundle") != bundle:
        raise ResultsError(f"foreign results file {path}: it comes from bundle {str(header.get('bundle'))[:12]}, "
                           f"not this one ({bundle[:12]}) — merge it with --bundle pointing at the bundle it ran")
    end = entries[-1]
    if end.get("kind") != "end" or size != len(data):
        raise ResultsError(f"truncated results file {path}: the run did not finish (no end line) — rerun ./run.sh "
                           "on the Mac (it resumes where it stopped), then copy results/results.jsonl again")
    body = data[: data.rfind(b"\n", 0, len(data) - 1) + 1]
    if end.get("digest") != digest(body):
        raise ResultsError(f"tampered results file {path}: its digest does not match its content (damaged or "
                           f"edited after the run) — {AGAIN}")
    return _collect(path, entries, probes, on_pass)


def _collect(path, entries: list[dict], probes, on_pass: str) -> Results:
    outcomes, envs, host, repro = {}, {}, {}, {}
    for number, entry in enumerate(entries, 1):
        kind, wrong = entry.get("kind"), _misshapen(entry)
        if wrong:
            raise ResultsError(f"corrupted results file {path}: line {number} ({kind}) has {wrong} — {AGAIN}")
        if kind == "outcome":
            try:
                outcome = PassOutcome.from_dict({k: v for k, v in entry.items() if k != "kind"})
            except (ProtocolError, TypeError, KeyError, ValueError, AttributeError) as exc:
                raise ResultsError(f"corrupted results file {path}: line {number} is not a probe outcome "
                                   f"({str(exc)[:120]}) — {AGAIN}") from None
            outcomes[(outcome.probe, outcome.pass_name)] = outcome
        elif kind == "environment":
            envs[entry.get("pass")] = entry.get("environment")
        elif kind == "host":
            host = entry.get("files") or {}
        elif kind == "repro":
            repro[entry.get("script")] = entry
    off = {probe: o for (probe, pass_name), o in outcomes.items() if pass_name == "off"}  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
    missing = sorted(needed(probes, off, on_pass) - set(outcomes))
    if missing:
        raise ResultsError(f"truncated results file {path}: {len(missing)} probe outcomes are missing (first: "
                           f"{missing[0][0]}, pass {missing[0][1]}) — rerun ./run.sh on the Mac, then copy it again")
    return Results(entries[0], outcomes, envs, host, repro, entries[-1])
