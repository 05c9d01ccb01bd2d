"""Shared: the closed set of verdicts, their severity ranks, and evidence records.

Ranks order severity for `--fail-on`, a module's worst verdict and the lane (see the README).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(str, enum.Enum):
    """What happens to one (op, dtype signature) on MPS."""

    NATIVE = "native"
    UNKNOWN = "unknown"
    CPU_FALLBACK = "cpu_fallback"
    UNSUPPORTED = "unsupported"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    MISMATCH = "mismatch"
    ERROR = "error"
    CRASH = "crash"
    TIMEOUT = "timeout"

    @property
    def rank(self) -> int:
        """Severity: 0 (native) .. 5 (crash, timeout)."""
        return _RANKS[self]

    def __str__(self) -> str:
        return self.value


_RANKS = {
    Verdict.NATIVE: 0,
    Verdict.UNKNOWN: 1,
    Verdict.CPU_FALLBACK: 2,
    Verdict.UNSUPPORTED: 3,
    Verdict.UNSUPPORTED_DTYPE: 3,
    Verdict.MISMATCH: 4,
    Verdict.ERROR: 4,
    Verdict.CRASH: 5,
    Verdict.TIMEOUT: 5,
}


class Source(str, enum.Enum):
    """Whether a verdict was predicted from the knowledge base or measured by a probe."""

    PREDICTED = "predicted"
    MEASURED = "measured"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Evidence:
    """Why a verdict was given: a stable rule id, a sentence, and where the fact comes from."""

    rule: str
    text: str
    source: str

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"rule": self.rule, "text": self.text, "source": self.source}


@dataclass(frozen=True)
class Classification:
    """A verdict with its evidence, remedy and first native release."""

    verdict: Verdict
    evidence: Evidence
    remedy: str | None = None
    since: str | None = None
    # set when the placement model decided the verdict (predict/placement.py: a host tensor the kernel refuses, or
    # one whose fate is not established): the call's classification were its tensors on the device, which the lane reads
    hardware: Classification | None = None
