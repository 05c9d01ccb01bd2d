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
    "176767": Repro("2.11.0"),
    "174861": Repro("2.10.0"),
    "129207": Repro("2.4.0"),
    "141471": Repro("2.5.0"),
    "183825": Repro("2.12.0", train=True),
    "124096": Repro("2.13.0"),
    "182822": Repro("2.12.0"),
    "183631": Repro("2.12.0"),
    "114692": Repro("2.1.0"),
    "163327": Repro("2.14.1"),
    "195074": Repro("2.14.1"),
    "183419": Repro("2.12.0", fake=True),
    "182052": Repro("2.12.0", fake=True),
    "185663": Repro("2.12.0", fake=True),
    "171602": Repro("2.10.0"),
    "174339": Repro("2.14.1"),
    "175189": Repro("2.13.0", macos="15.0", train=True),
    "135447": Repro("2.7.0", train=True),
    "100764": Repro("2.0.0"),
    "118115": Repro("2.2.0"),
    "95417": Repro("2.0.0"),
    "189563": Repro("2.13.0"),
    "149951": Repro("2.7.0"),
    "160208": Repro("2.8.0"),
    "144190": Repro("2.6.0"),
    "147889": Repro("2.6.0"),
    "176296": Repro("2.11.0"),
    "151443": Repro("2.7.0"),
    "160738": Repro("2.8.0"),
    "189134": Repro("2.13.0"),
    "144245": Repro("2.6.0"),
    "160743": Repro("2.8.0"),
    "166746": Repro("2.9.0", train=True),
    "98191": Repro("2.0.0"),
    "187017": Repro("2.13.0"),
    "95538": Repro("2.0.0"),
    "104879": Repro("2.0.0", macos="13.0"),  # below macOS 13 the kernel runs unique on the CPU itself
    "96614": Repro("2.0.0"),
    "165257": Repro("2.9.0"),
    "125803": Repro("2.3.0", macos="14.4", train=True, near=False),
    "190056": Repro("2.13.0", train=True),
    "115152": Repro("2.2.0"),
    "179352": Repro("2.12.0", fake=True),
    "197114": Repro("2.14.1", macos="26.2"),
    "156792": Repro("2.12.0"),
    "124335": Repro("2.3.0", fake=True),
    "90421": Repro("2.0.0"),
    "175192": Repro("2.11.0", train=True),
}


FORWARD_NEAR = {"175192"}  # the near miss is the same call without gradients (forward only)


def fired(factory: str, release: str, repro: Repro, bug_id: str) -> bool:
    """Whether the scan of `factory` at `release`, with entry `bug_id` the only one known, reports a row decided
    by it (alone, so that another entry met by the same call cannot hide it)."""
    from dataclasses import replace

    from opscan.scan import ScanOptions, prepare, scan

    options = ScanOptions(f"{TARGETS}:{factory}", torch_version=release, macos=repro.macos, chip=repro.chip,
                          inference=not repro.train, fake=repro.fake, memory=False)
    prepared = prepare(options)
    silent = {op: tuple(b for b in bugs if b.id == bug_id) for op, bugs in prepared.kb.silent.items()}
    kb = replace(prepared.kb, silent={op: bugs for op, bugs in silent.items() if bugs})
    report = scan(options, prepared=replace(prepared, kb=kb))
    return any(row.evidence.rule == f"silent-bug-{bug_id}" for row in report.rows)


def test_every_entry_has_its_reporters_repro():
    assert set(REPROS) == {b.id for b in load_bugs()[1]}


@pytest.mark.parametrize("bug_id", sorted(REPROS))
def test_the_reporters_repro_meets_its_entry(bug_id):
    assert fired(f"repro_{bug_id}", REPROS[bug_id].release, REPROS[bug_id], bug_id)


@pytest.mark.parametrize("bug_id", sorted(i for i, r in REPROS.items() if r.near))
def test_the_near_miss_does_not(bug_id):
    repro = REPROS[bug_id]
    near = Repro(repro.release, repro.macos, repro.chip, False, repro.fake) if bug_id in FORWARD_NEAR else repro
    assert not fired(f"near_{bug_id}", repro.release, near, bug_id)


@pytest.mark.parametrize("bug_id", sorted(b.id for b in load_bugs()[1] if b.fixed_in))
def test_the_fixing_release_does_not(bug_id):
    bug = next(b for b in load_bugs()[1] if b.id == bug_id)
    assert not fired(f"repro_{bug_id}", bug.fixed_in, REPROS[bug_id], bug_id)
