"""Every silent-bug entry against its reporter's own repro (tests/targets/silent_repros.py): the repro, traced as
opscan traces a user's step, meets the entry in a release it affects (with the macOS and chip the entry needs);
its near miss does not — the same step made safe as the thread says (`near_<id>`), and the repro itself at the
fixing release. Fake tensors stand in where the repro is over 2**31 elements."""

from __future__ import annotations

import os
import pytest

from opscan.knowledge.silent_bugs import load_bugs

TARGETS = os.path.join(os.path.dirname(__file__), "targets", "silent_repros.py")


def _repros():
    """The targets file's REPROS table (each entry's affected release, macOS, chip and step mode)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("silent_repros_table", TARGETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.REPROS, module.Repro


REPROS, Repro = _repros()
FORWARD_NEAR = {"175192"}  # the near miss is the same call without gradients (forward only)


_TRACES: dict = {}  # (factory, macos, chip, train, fake) -> [(Prepared, seconds)]: one trace serves every release
# that would trace the step identically (opscan.zoo.releases.trace_serving), so a repro's fixing release reuses it


def fired(factory: str, release: str, repro: Repro, bug_id: str) -> bool:
    """Whether the scan of `factory` at `release`, with entry `bug_id` the only one known, reports a row decided
    by it (alone, so that another entry met by the same call cannot hide it)."""
    from dataclasses import replace

    from opscan.knowledge import load_knowledge
    from opscan.scan import ScanOptions, scan
    from opscan.zoo.releases import trace_serving

    options = ScanOptions(f"{TARGETS}:{factory}", torch_version=release, macos=repro.macos, chip=repro.chip,
                          inference=not repro.train, fake=repro.fake, memory=False)
    kb = load_knowledge(release=release, macos=repro.macos, chip=repro.chip)
    traced = _TRACES.setdefault((factory, repro.macos, repro.chip, repro.train, repro.fake), [])
    prepared = traced[trace_serving(traced, kb, options)][0]
    silent = {op: tuple(b for b in bugs if b.id == bug_id) for op, bugs in kb.silent.items()}
    kb = replace(kb, silent={op: bugs for op, bugs in silent.items() if bugs})
    report = scan(options, prepared=replace(prepared, kb=kb))
    return any(row.evidence.rule == f"silent-bug-{bug_id}" for row in report.rows)


def test_every_entry_has_its_reporters_repro():
    assert set(REPROS) == {b.id for b in load_bugs()}


@pytest.mark.parametrize("bug_id", sorted(REPROS))
def test_the_reporters_repro_meets_its_entry(bug_id):
    assert fired(f"repro_{bug_id}", REPROS[bug_id].release, REPROS[bug_id], bug_id)


@pytest.mark.parametrize("bug_id", sorted(i for i, r in REPROS.items() if r.near))
def test_the_near_miss_does_not(bug_id):
    repro = REPROS[bug_id]
    near = Repro(repro.release, repro.macos, repro.chip, False, repro.fake) if bug_id in FORWARD_NEAR else repro
    assert not fired(f"near_{bug_id}", repro.release, near, bug_id)


@pytest.mark.parametrize("bug_id", sorted(b.id for b in load_bugs() if b.fixed_in))
def test_the_fixing_release_does_not(bug_id):
    bug = next(b for b in load_bugs() if b.id == bug_id)
    assert not fired(f"repro_{bug_id}", bug.fixed_in, REPROS[bug_id], bug_id)


def test_the_mac_probe_set_builds_from_the_repros():
    """tools/silent/probe_set.py: each entry it settles is an entry with a repro, and both steps build."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "silent", "probe_set.py")
    spec = importlib.util.spec_from_file_location("silent_probe_set", path)
    probe_set = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe_set)
    assert set(probe_set.SETTLE) <= set(REPROS) and all(mode in ("forward", "training")
                                                        for mode, _ in probe_set.SETTLE.values())
    for factory in (probe_set.forward_set, probe_set.training_set):
        model, inputs = factory()
        assert len(model.repros) == len(inputs) and model(*inputs).dim() == 0
