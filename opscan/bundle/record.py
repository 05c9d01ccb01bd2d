"""Bundle: the local record of every bundle made here — what `opscan merge` trusts instead of the folder it gets.

A bundle folder travels (to a Mac and back, through other people's hands); whoever holds it can edit
manifest.json and recompute its `bundle_hash`, which is a checksum, not a signature. So `opscan bundle` also
writes the manifest it made into a store on this machine, outside the bundle folder:

    $XDG_STATE_HOME/opscan/bundles/<bundle hash>.json     (default ~/.local/state/opscan/bundles/, mode 0700)

and `opscan merge` takes the target, the scan flags, the device, the plan's fingerprint and every file digest
from that record, never from the folder: a received manifest must equal its record field for field. One that
does not — a bundle whose record is missing but which shares its plan fingerprint with one made here is
an edited copy of that one — is refused (exit 2) naming the fields that changed; one with no record at all was
not made here (or by an opscan before this store existed) and is refused as well. Nothing of the received
folder is imported or run by merge; the record is read by the one reader (opscan/trust/read.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from opscan.errors import OpscanError

HASH = re.compile(r"[0-9a-f]{64}")
MAX_SHOWN = 3  # changed fields named in the refusal


class UntrustedBundleError(OpscanError):
    """A bundle whose manifest is not the one recorded here when it was made."""


def store() -> Path:
    """The folder of the records (XDG_STATE_HOME, else ~/.local/state)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "opscan" / "bundles"


def record_path(bundle_hash: str) -> Path:
    """Where the record of the bundle with this hash lives (a hash that is not 64 hex digits has none)."""
    if not isinstance(bundle_hash, str) or not HASH.fullmatch(bundle_hash):
        raise UntrustedBundleError(f"the bundle's manifest names no valid bundle_hash ({str(bundle_hash)[:20]!r}) "
                                   "— unpack the bundle again, or make a new one")
    return store() / f"{bundle_hash}.json"


def trusted_manifest(received: dict, folder: Path) -> dict:
    """The manifest recorded here for the bundle `received` claims to be; UntrustedBundleError when there is
    none, or when the received one differs from it (naming the fields that changed)."""
    recorded = _read(record_path(received.get("bundle_hash")))
    if recorded is None:
        recorded = _same_plan(received)
        if recorded is None:
            raise UntrustedBundleError(
                f"{folder} was not made on this machine: no record of bundle {str(received['bundle_hash'])[:12]} in "
                f"{store()} (merge imports and runs the bundle's target, so it only merges bundles made here) — "
                "merge on the machine that made it, or make the bundle again here with `opscan bundle`")
    changed = changes(recorded, received)
    if changed:
        shown = "; ".join(changed[:MAX_SHOWN]) + (f"; and {len(changed) - MAX_SHOWN} more" if len(changed) >
                                                   MAX_SHOWN else "")
        raise UntrustedBundleError(f"{folder}/manifest.json was changed after the bundle was made here: {shown} — "
                                   "merge only the bundle as `opscan bundle` wrote it: unpack it again, or make a "
                                   "new one")
    return recorded


def _read(path: Path) -> dict | None:
    from opscan.trust.read import read_json

    if not path.is_file():
        return None
    data = read_json(path, "the bundle record", f"remove it and make the bundle again (records: {store()})",
                     error=UntrustedBundleError)
    return data if isinstance(data, dict) else None


def _same_plan(received: dict) -> dict | None:
    """The record of a bundle made here with the received one's plan fingerprint (the received one is an edited
    copy of it), the one differing least; None when there is none."""
    fingerprint = received.get("fingerprint")
    if not isinstance(fingerprint, str) or not store().is_dir():
        return None
    found = []
    for path in sorted(store().glob("*.json")):
        if HASH.fullmatch(path.stem):
            recorded = _read(path)
            if recorded is not None and recorded.get("fingerprint") == fingerprint:
                found.append((len(changes(recorded, received)), str(path), recorded))
    return min(found)[2] if found else None


def changes(recorded, received, where: str = "") -> list[str]:
    """'field: was X, is now Y' for every leaf that differs between the two manifests (bundle_hash last)."""
    if isinstance(recorded, dict) and isinstance(received, dict):
        out = []
        for key in sorted(set(recorded) | set(received), key=lambda k: (k == "bundle_hash", str(k))):
            out += changes(recorded.get(key), received.get(key), f"{where}.{key}" if where else str(key))
        return out
    if recorded == received:
        return []
    return [f"{where or 'the manifest'}: was {_short(recorded)}, is now {_short(received)}"]


def _short(value) -> str:
    from opscan.trust.text import printable

    text = printable(json.dumps(value) if not isinstance(value, str) else repr(value), newlines=False)
    return text if len(text) <= 80 else text[:77] + "..."
