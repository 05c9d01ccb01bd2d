"""Knowledge: what a Mac does with user code written for CUDA, per torch release (device_code.yaml).

One entry per rule of the trace's device calls (opscan/trace/device_calls.py): the call it is about, its MPS
spelling, and release ranges, each saying what a Mac does there (`effect`, `text`), where that comes from (`source`:
the macOS wheels' files and lines, or issue threads with `confidence: reported`) and, when the range has its own,
the fix. The file is package data, validated on load (a bad entry is a bug in opscan: ValueError naming it).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import yaml

from opscan.knowledge.schema import derived, entry_values
from opscan.opkey import ReleaseRange

DEVICE_TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_code.yaml")
EFFECTS = ("raises", "cpu", "warns", "ignored", "answers")  # most severe first
_CONFIDENCE = ("source", "reported")


@dataclass(frozen=True)
class MacBehaviour:
    """What a Mac does with one rule's call in one release range (a `mac:` item of device_code.yaml)."""

    releases: ReleaseRange  # "2.0.0..2.14.1"
    effect: str  # one of EFFECTS
    text: str
    source: str
    fix: str = ""  # the item's own, else its rule's
    confidence: str = "source"  # "reported": from issue threads, the wheels could not say
    rule: str = derived(default="")  # the rule (the entry's key) and its call, from the entry
    call: str = derived(default="")


def behaviour(rule: str, release: str, path: str = DEVICE_TABLE_PATH) -> MacBehaviour | None:
    """The range of `rule` that holds for `release` (the first that covers it), or None."""
    return next((b for b in device_table(path).get(rule, ()) if b.releases.covers(release)), None)


@functools.lru_cache(maxsize=4)
def device_table(path: str = DEVICE_TABLE_PATH) -> dict[str, tuple[MacBehaviour, ...]]:
    """rule -> its ranges, validated (see the module docstring)."""
    with open(path, encoding="utf-8") as fh:
        return parse_device_table(yaml.safe_load(fh))


def parse_device_table(raw: dict) -> dict[str, tuple[MacBehaviour, ...]]:
    """A loaded device_code.yaml: rule -> its ranges (ValueError naming a bad entry)."""
    return {rule: tuple(_ranges(rule, entry)) for rule, entry in raw.items()}


def _ranges(rule: str, entry: dict):
    unknown = sorted(set(entry) - {"call", "fix", "mac"}) if isinstance(entry, dict) else []
    if not rule.startswith("device-") or not isinstance(entry, dict) or unknown or not (entry.get("call")
                                                                                         and entry.get("mac")):
        raise ValueError(f"device_code.yaml: bad rule {rule!r} (a device- id, a call and mac ranges, and an "
                         f"optional fix; unknown {unknown})")
    for part in entry["mac"]:
        words = lambda text: " ".join(str(text or "").split())  # noqa: E731
        found = MacBehaviour(**entry_values(
            MacBehaviour, part, "device_code.yaml", f"{rule} range", releases=ReleaseRange.parse, text=words,
            source=words, fix=words), rule=rule, call=entry["call"])
        found = replace(found, fix=found.fix or words(entry.get("fix")))
        if found.effect not in EFFECTS or found.confidence not in _CONFIDENCE or not (found.text and found.fix):
            raise ValueError(f"device_code.yaml: {rule} {found.releases}: effect, confidence, text, source and fix "
                             "are required")
        yield found
