"""Every silent-bug entry against its reporter's own repro (tests/targets/silent_repros.py): the repro, traced as
opscan traces a user's step, meets the entry in a release it affects (with the macOS and chip the entry needs);
its near miss does not — the same step made safe as the thread says (`near_<id>`), and the repro itself at the
fixing release. Fake tensors stand in where the repro is over 2**31 elements."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from opscan.knowledge.silent_bugs import load_bugs

TARGETS = os.path.join(os.path.dirname(__file__), "targets", "silent_repros.py")


@dataclass(frozen=True)
class Repro:
    """How to scan an entry's repro: an affected release, the macOS and chip it needs, and the step's mode."""

    release: str
    macos: str | None = None
    chip: str | None = None
    train: bool = False  # the whole training step (the entry is on a backward op); else forward only
    fake: bool = False  # fake tensors (the repro is over 2**31 elements)
    near: bool = True  # a near_<id> factory exists


REPROS = {
    "161640": Repro("2.8.0", macos="15.0"),
    "133520": Repro("2.4.0", train=True),
    "187117": Repro("2.12.0"),
    "145203": Repro("2.5.0", macos="15.0"),
    "197636": Repro("2.14.1", fake=True),
    "189495": Repro("2.12.0", macos="15.0"),
    "163597": Repro("2.8.0", macos="15.0"),  # a non-contiguous query reaches the MPS kernel on macOS 15+ only
    "181133": Repro("2.10.0", macos="15.0"),
    "192212": Repro("2.13.0", macos="15.0"),
    "140902": Repro("2.5.0", train=True),
    "180201": Repro("2.11.0", macos="15.0", train=True, near=False),
    "124621": Repro("2.3.0"),
    "124834": Repro("2.3.0"),
    "151460": Repro("2.7.0"),
    "180984": Repro("2.12.0"),
    "188756": Repro("2.13.0", fake=True),
    "180776": Repro("2.12.0", macos="26.4", chip="M5"),
    "188438": Repro("2.13.0", macos="26.0", chip="M1", train=True),
    "116769": Repro("2.2.0", macos="14.1"),
    "174345": Repro("2.11.0"),
    "110120": Repro("2.1.0"),
    "195163": Repro("2.13.0", chip="M2"),
}


def fired(factory: str, release: str, repro: Repro) -> set[str]:
    """The silent-bug rules the scan of `factory` at `release` reports (rows decided by a silent-bug entry)."""
    from opscan.scan import ScanOptions, scan

    options = ScanOptions(f"{TARGETS}:{factory}", torch_version=release, macos=repro.macos, chip=repro.chip,
                          inference=not repro.train, fake=repro.fake, memory=False)
    return {row.evidence.rule for row in scan(options).rows if row.evidence.rule.startswith("silent-bug-")}


def test_every_entry_has_its_reporters_repro():
    assert set(REPROS) == {b.id for b in load_bugs()[1]}


@pytest.mark.parametrize("bug_id", sorted(REPROS))
def test_the_reporters_repro_meets_its_entry(bug_id):
    assert f"silent-bug-{bug_id}" in fired(f"repro_{bug_id}", REPROS[bug_id].release, REPROS[bug_id])


@pytest.mark.parametrize("bug_id", sorted(i for i, r in REPROS.items() if r.near))
def test_the_near_miss_does_not(bug_id):
    assert f"silent-bug-{bug_id}" not in fired(f"near_{bug_id}", REPROS[bug_id].release, REPROS[bug_id])


@pytest.mark.parametrize("bug_id", sorted(b.id for b in load_bugs()[1] if b.fixed_in))
def test_the_fixing_release_does_not(bug_id):
    bug = next(b for b in load_bugs()[1] if b.id == bug_id)
    assert f"silent-bug-{bug_id}" not in fired(f"repro_{bug_id}", bug.fixed_in, REPROS[bug_id])
