"""The leaderboard: every model's result (ModelResult) over the releases scanned, and its JSON form.

A cell is one model x one release: the ReleaseResult (lane, whether the whole step is native, the blocking rows
with their evidence) plus where the cell comes from: `source` "predicted" (opscan's knowledge base, on any
machine) or "measured" (probes on a Mac, merged in later: merge_measured), and `origin` (which opscan and
knowledge base, or which Mac). The JSON (`schema` SCHEMA) keeps each cell whole, so a measured cell replaces a
predicted one without touching the rest.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from typing import Any

from opscan.errors import UsageError
from opscan.opkey import Release
from opscan.zoo.models import ZooModel
from opscan.zoo.releases import ReleaseResult

SCHEMA = "opscan-zoo/1"
MADE_KEYS = ("commit", "knowledge")  # a model's provenance: the opscan commit and knowledge digest that scanned it



@dataclass(frozen=True)
class Cell:
    """One model x one release: its ReleaseResult, and whether it is predicted or measured, and by what."""

    result: ReleaseResult
    source: str = "predicted"  # "predicted" | "measured"
    origin: str = ""  # e.g. "opscan 0.1.0 knowledge base" or "measured on macOS 15.2, torch 2.6.0"

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the ReleaseResult's, with source and origin."""
        return {**self.result.to_dict(), "source": self.source, "origin": self.origin}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Cell":
        """The cell to_dict wrote (with the trace its release was judged from, when the JSON has it)."""
        return cls(ReleaseResult.from_dict(data), data.get("source", "predicted"), data.get("origin", ""))


@dataclass(frozen=True)
class ModelResult:
    """One model's row of the leaderboard: a cell per release, or the one-line reason it could not be scanned."""

    model: ZooModel
    cells: tuple[Cell, ...]
    seconds: float
    error: str | None = None
    fake: bool | None = None  # traced with fake tensors (None: not traced)
    # the commit and knowledge digest it was scanned with (zoo/provenance.py; None: scanned before it existed)
    made: dict[str, str] | None = field(default=None, compare=False)

    @property
    def status(self) -> str:
        return "error" if self.error else "ok"

    def first_native(self, releases: tuple[str, ...]) -> str | None:
        """The first of `releases` (oldest first) whose whole step is native, or None."""
        native = {c.result.release for c in self.cells if c.result.native}
        return next((r for r in sorted(releases, key=Release.parse) if r in native), None)

    def cell(self, release: str) -> Cell | None:
        return next((c for c in self.cells if c.result.release == release), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a journal line's body, and the leaderboard's model entries)."""
        return {"model": self.model.to_dict(), "status": self.status, "error": self.error,
                "seconds": round(self.seconds, 3), "fake": self.fake, **(self.made or {}),
                "cells": [c.to_dict() for c in self.cells]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelResult":
        made = {k: str(data[k]) for k in MADE_KEYS if data.get(k)}
        return cls(ZooModel.from_dict(data["model"]), tuple(Cell.from_dict(c) for c in data["cells"]),
                   float(data["seconds"]), data.get("error"), data.get("fake"), made or None)


@dataclass(frozen=True)
class Leaderboard:
    """Every model's result over `releases`: what the HTML, JSON and CSV outputs render."""

    title: str  # the family or manifest scanned
    releases: tuple[str, ...]  # oldest first
    models: tuple[ModelResult, ...]
    opscan: str = ""
    created: str = ""
    # zoo/provenance.py board_provenance (None: a board made before boards recorded it)
    provenance: dict[str, Any] | None = field(default=None, compare=False)

    def counts(self) -> dict[str, int]:
        """Cells by source, and models that could not be scanned."""
        cells = [c for m in self.models for c in m.cells]
        return {"models": len(self.models), "errors": sum(1 for m in self.models if m.error),
                "cells": len(cells), "predicted": sum(1 for c in cells if c.source == "predicted"),
                "measured": sum(1 for c in cells if c.source == "measured")}

    def to_dict(self) -> dict[str, Any]:
        """The leaderboard JSON (schema SCHEMA)."""
        return {"schema": SCHEMA, "title": self.title, "opscan": self.opscan, "created": self.created,
                **({"provenance": self.provenance} if self.provenance else {}),
                "releases": list(self.releases), "counts": self.counts(),
                "models": [{**m.to_dict(), "first_native": m.first_native(self.releases)} for m in self.models]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "leaderboard") -> "Leaderboard":
        """A leaderboard to_dict wrote (UsageError, one line, for anything else)."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise UsageError(f"{where} is not an opscan zoo leaderboard (schema {found!r}, expected {SCHEMA!r})")
        try:
            models = tuple(ModelResult.from_dict(m) for m in data["models"])
            title, releases = data["title"], tuple(data["releases"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where}: a model entry is incomplete ({type(exc).__name__}: {exc})") from None
        bad = [r for r in releases if not _is_release(r)]
        if bad:
            raise UsageError(f"{where}: {bad[0]!r} in its releases is not a torch release (such as 2.14.1)")
        provenance = data.get("provenance") if isinstance(data.get("provenance"), dict) else None
        return cls(title, releases, models, data.get("opscan", ""), data.get("created", ""), provenance)


def _is_release(text) -> bool:
    try:
        Release.parse(text)
    except (TypeError, ValueError):
        return False
    return True


def make_board(title: str, releases: tuple[str, ...], results: list[ModelResult]) -> Leaderboard:
    """The leaderboard of `results` (in name order), stamped with this opscan's version, the time and its
    provenance (what its models were scanned with, the macOS each release assumes)."""
    from opscan import __version__
    from opscan.zoo.provenance import board_provenance

    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ordered = tuple(sorted(results, key=lambda m: m.model.name))
    releases = tuple(sorted(releases, key=Release.parse))
    provenance = board_provenance(releases, [m.made or {} for m in ordered])
    return Leaderboard(title, releases, ordered, __version__, created, provenance)


def merge_measured(board: Leaderboard, measured: dict[tuple[str, str], Cell]) -> Leaderboard:
    """`board` with the cells of `measured` ({(model name, release): Cell with source "measured"}) in place of
    the predicted ones; cells measured for a release the board lacks are added to its releases."""
    models = []
    for m in board.models:
        mine = {r: c for (name, r), c in measured.items() if name == m.model.name}
        kept = tuple(c for c in m.cells if c.result.release not in mine)
        models.append(replace(m, cells=tuple(sorted(kept + tuple(mine.values()),
                                                    key=lambda c: Release.parse(c.result.release)))))
    releases = set(board.releases) | {r for (_, r) in measured}
    return replace(board, models=tuple(models), releases=tuple(sorted(releases, key=Release.parse)))
