"""PYTORCH_ENABLE_MPS_FALLBACK exported by the user (1 or 0) in the shell that starts opscan, and where probes run.

Every other probe test clears the variable first, so these keep it exported in the parent (monkeypatch.setenv:
os.environ, which the runner copies for its workers) and check, through the real runner and real worker
processes, that the off pass runs with it *unset* and the on pass with it "1" — each worker's environment record
says so, and on the SIMULATED MPS backend (tests/simulated_mps, which reads the variable once at import, as
torch does) the behaviour agrees: an op without a kernel raises NotImplementedError in the off pass and falls
back to the CPU in the on pass. A stale "1" kept in the off pass would hide every missing kernel; a stale "0"
would report "0", not "unset", as the environment the verdicts rest on.

Where workers come from: real MPS (and anything on a Mac) gets spawned interpreters, never forks of a warm
zygote (Metal and the Objective-C runtime are not fork-safe); Linux with a forkable backend gets the zygote.
"""

from __future__ import annotations

import sys

import pytest

import simulated_mps
from opscan.probe.calls import make
from opscan.probe.launch import SpawnLauncher, ZygoteLauncher
from opscan.probe.protocol import TensorSpec
from opscan.probe.runner import FALLBACK_VAR, Observer, Pool, RunnerOptions, isolation_for, run_probes

F32 = TensorSpec("float32", (4, 4), (4, 1))


class Recorder(Observer):
    """Each pass's environment record and outcomes."""

    def __init__(self):
        self.environments, self.outcomes = {}, []

    def environment(self, pass_name, record):
        self.environments[pass_name] = record

    def outcome(self, outcome):
        self.outcomes.append(outcome)


def _probe(op: str):
    return make(op, [F32], {"args": [{"t": 0}], "kwargs": {}})


@pytest.mark.parametrize("exported", ["1", "0"])
def test_on_the_cpu_the_off_pass_unsets_an_exported_variable_and_the_on_pass_sets_1(monkeypatch, exported):
    monkeypatch.setenv(FALLBACK_VAR, exported)
    recorder = Recorder()
    relu = _probe("aten::relu")
    result = run_probes([relu], RunnerOptions(device="cpu", workers=1, on_pass="always"), observer=recorder)
    assert {p: r["fallback_env"] for p, r in recorder.environments.items()} == {"off": "unset", "on": "1"}
    assert result.off[relu.id].status == result.on[relu.id].status == "ran"
    assert {o.pass_name for o in recorder.outcomes} == {"off", "on"}


@pytest.mark.parametrize("exported, isolation", [("1", "zygote"), ("0", "zygote"), ("1", "spawn")])
def test_on_simulated_mps_the_off_pass_unsets_an_exported_variable_and_the_on_pass_sets_1(monkeypatch, exported,
                                                                                         isolation):
    monkeypatch.setenv(FALLBACK_VAR, exported)
    recorder = Recorder()
    cos, relu = _probe("aten::cos"), _probe("aten::relu")
    double = simulated_mps.double({"ops": {"aten::cos": "unsupported"}})  # no MPS kernel for cos
    options = RunnerOptions(device="mps", workers=1, timeout=30.0, isolation=isolation, double=double)
    result = run_probes([cos, relu], options, observer=recorder)
    assert {p: r["fallback_env"] for p, r in recorder.environments.items()} == {"off": "unset", "on": "1"}
    off, on = result.off[cos.id], result.on[cos.id]
    assert (off.status, off.exc_type) == ("raised", "NotImplementedError"), off  # the variable was not seen
    assert off.message.startswith("The operator 'aten::cos' is not currently implemented for the MPS device")
    assert on.status == "ran" and on.fallback_seen, on  # ... and "1" was, at import: the CPU fallback ran
    assert result.off[relu.id].status == "ran" and relu.id not in result.on  # clean: no on pass needed


def test_real_mps_workers_are_spawned_never_forked(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert isolation_for(RunnerOptions(device="mps")) == "spawn"  # real MPS, even where forking is allowed
    assert isolation_for(RunnerOptions(device="cpu")) == "zygote"
    assert isolation_for(RunnerOptions(device="mps", double=simulated_mps.double())) == "zygote"  # a forkable double
    assert isolation_for(RunnerOptions(device="mps", isolation="zygote")) == "zygote"  # only when asked for
    monkeypatch.setattr(sys, "platform", "darwin")
    assert isolation_for(RunnerOptions(device="mps")) == "spawn"
    assert isolation_for(RunnerOptions(device="cpu")) == "spawn"  # on a Mac nothing is forked


@pytest.mark.parametrize("exported", ["1", "0"])
def test_the_pool_for_real_mps_spawns_its_workers_with_the_pass_environment(monkeypatch, exported):
    monkeypatch.setenv(FALLBACK_VAR, exported)
    for pass_name, expected in (("off", None), ("on", "1")):
        pool = Pool(pass_name, RunnerOptions(device="mps", workers=2), lambda _o: None)  # starts no process yet
        assert type(pool.launcher) is SpawnLauncher and not isinstance(pool.launcher, ZygoteLauncher)
        assert pool.launcher.device == "mps" and pool.launcher.env.get(FALLBACK_VAR) == expected
        pool.launcher.close()
