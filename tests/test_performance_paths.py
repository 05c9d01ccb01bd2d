"""What the performance work (issue 18) changed is how fast, never what: the collector's blocks, the probe
workers' threads, and a whole scan with and without the collector out of the way."""

from __future__ import annotations

import gc
import os

import pytest

from conftest import EXAMPLES
from opscan.probe.runner import THREADS_VAR, pass_env
from opscan.trace import collector


@pytest.fixture
def collector_state():
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    gc.unfreeze() if gc.get_freeze_count() > frozen else None
    gc.enable() if enabled else gc.disable()


def test_spared_freezes_what_exists_and_restores_the_collector(collector_state):
    gc.enable()
    gc.unfreeze()
    before = [[i] for i in range(1000)]  # lists: objects the collector tracks
    with collector.spared():
        assert not gc.isenabled() and gc.get_freeze_count() >= len(before)
        outer = gc.get_freeze_count()
        made = [[i] for i in range(500)]
        with collector.spared():  # an inner block freezes what the outer one made meanwhile
            assert gc.get_freeze_count() >= outer + len(made)
        assert not gc.isenabled() and gc.get_freeze_count() >= outer + len(made)  # the inner exit unfreezes nothing
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the outermost exit: back to the oldest generation
    with pytest.raises(ValueError), collector.spared():
        raise ValueError("the step failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    del before, made


def test_spared_leaves_a_disabled_collector_disabled(collector_state):
    gc.disable()
    with collector.spared():
        pass
    assert not gc.isenabled()


def test_pool_workers_share_the_cores(monkeypatch):
    monkeypatch.delenv(THREADS_VAR, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert pass_env("off", workers=4)[THREADS_VAR] == "4"  # 16 cores / 4 workers
    assert pass_env("off", workers=32)[THREADS_VAR] == "1"  # never below one thread
    assert THREADS_VAR not in pass_env("off")  # without a pool size: the environment as it is
    monkeypatch.setenv(THREADS_VAR, "3")
    assert pass_env("on", workers=4)[THREADS_VAR] == "3"  # the user's own setting wins


def test_a_scan_is_the_same_without_the_collector_measures(monkeypatch):
    # the whole report (trace, MPS view, verdicts, graph, memory estimate and sizing runs) with the collector
    # frozen and off during the scan, and with it left alone
    import contextlib

    from opscan.render import render_json
    from opscan.scan import ScanOptions, scan

    options = ScanOptions(f"{EXAMPLES / 'llama.py'}:build_model")
    spared = render_json(scan(options))
    monkeypatch.setattr(collector, "spared", contextlib.nullcontext)
    plain = render_json(scan(options))
    assert spared == plain
