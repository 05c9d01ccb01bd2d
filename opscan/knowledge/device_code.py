"""Knowledge: what a Mac does with user code written for CUDA, per torch release (device_code.yaml).

One entry per rule of the trace's device calls (opscan/trace/device_calls.py): the call it is about, its MPS
spelling, and release ranges, each saying what a Mac does there (`effect`, `text`), where that comes from (`source`:
the macOS wheels' files and lines, or issue threads with `confidence: reported`) and, when the range has its own,
the fix. The file is package data, validated on load (a bad entry is a bug in opscan: ValueError naming it).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import yaml

from opscan.opkey import Release

DEVICE_TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_code.yaml")
EFFECTS = ("raises", "cpu", "warns", "ignored", "answers")  # most severe first
_CONFIDENCE = ("source", "reported")


@dataclass(frozen=True)
class MacBehaviour:
    """What a Mac does with one rule's call in one release range."""

    rule: str
    call: str
    releases: str  # "2.0.0-2.14.1"
    effect: str  # one of EFFECTS
    text: str
    source: str
    fix: str
    confidence: str = "source"  # "reported": from issue threads, the wheels could not say

    def covers(self, release: str) -> bool:
        """Is `release` ("2.5.1", "2.14") within this range?"""
        first, _, last = self.releases.partition("-")
        at = Release.parse(release).numbers[:3]
        return Release.parse(first).numbers <= at + (0,) * (3 - len(at)) <= Release.parse(last).numbers


def behaviour(rule: str, release: str, path: str = DEVICE_TABLE_PATH) -> MacBehaviour | None:
    """The range of `rule` that holds for `release` (the first that covers it), or None."""
    return next((b for b in device_table(path).get(rule, ()) if b.covers(release)), None)


@functools.lru_cache(maxsize=4)
def device_table(path: str = DEVICE_TABLE_PATH) -> dict[str, tuple[MacBehaviour, ...]]:
    """rule -> its ranges, validated (see the module docstring)."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    return {rule: tuple(_ranges(rule, entry)) for rule, entry in raw.items()}


def _ranges(rule: str, entry: dict):
    if not rule.startswith("device-") or not entry.get("call") or not entry.get("mac"):
        raise ValueError(f"device_code.yaml: {rule}: needs a device- id, a call and mac ranges")
    for part in entry["mac"]:
        found = MacBehaviour(rule, entry["call"], str(part.get("releases", "")), part.get("effect", ""),
                             " ".join(str(part.get("text", "")).split()), " ".join(str(part.get("source", "")).split()),
                             " ".join(str(part.get("fix") or entry.get("fix") or "").split()),
                             part.get("confidence", "source"))
        if found.effect not in EFFECTS or found.confidence not in _CONFIDENCE or not (found.text and found.source
                                                                                        and found.fix):
            raise ValueError(f"device_code.yaml: {rule} {found.releases}: effect, confidence, text, source and fix "
                             "are required")
        first, sep, last = found.releases.partition("-")
        if not sep or Release.parse(first) > Release.parse(last):
            raise ValueError(f"device_code.yaml: {rule}: releases {found.releases!r} is not FIRST-LAST")
        yield found
