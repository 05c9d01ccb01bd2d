"""Measured mode through the real runner and real worker processes, on the SIMULATED MPS backend
(tests/simulated_mps: tests only): every row of the contract's decision table, both message
generations, warn-once defeated, an asynchronous error landing on its own probe, a segfault and an
abort in the middle of a pooled batch costing only their probe, a hang killed with its process group,
and the fallback variable read at import."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import pytest
import torch

import simulated_mps
from opscan.probe.calls import make
from opscan.probe.decide import decide
from opscan.probe.protocol import TensorSpec
from opscan.probe.runner import Observer, RunnerOptions, run_probes
from opscan.probe.zygote import _refusal
from opscan.verdict import Verdict

F32, F64 = TensorSpec("float32", (4, 4), (4, 1)), TensorSpec("float64", (4, 4), (4, 1))

# op, dtype, scripted MPS behaviour, expected verdict, words the evidence must contain
BATCH = [
    ("aten::relu", F32, "native", Verdict.NATIVE, "agrees"),
    ("aten::neg", F32, "wrong", Verdict.MISMATCH, "beyond float32 tolerance"),
    ("aten::abs", F32, "always_cpu", Verdict.CPU_FALLBACK, "aten::abs"),
    ("aten::expm1", F32, "always_cpu", Verdict.CPU_FALLBACK, "aten::expm1"),  # warn-once defeated
    ("aten::sin", F32, "always_cpu_wrong", Verdict.MISMATCH, "through the CPU fallback"),
    ("aten::cos", F32, "unsupported", Verdict.UNSUPPORTED, "141287"),
    ("aten::exp", F32, {"kind": "unsupported", "generation": "2.0-2.5"}, Verdict.UNSUPPORTED, "77764"),
    ("aten::tanh", F32, "unsupported_wrong", Verdict.MISMATCH, "PYTORCH_ENABLE_MPS_FALLBACK=1"),
    ("aten::sigmoid", F32, "unsupported_error", Verdict.ERROR, "ComplexFloat"),
    ("aten::ceil", F32, {"kind": "dtype", "dtypes": ["float32"]}, Verdict.UNSUPPORTED_DTYPE, "Trying to convert"),
    ("aten::floor", F32, "error", Verdict.ERROR, "Adaptive pool MPS"),
    ("aten::sqrt", F32, "async_error", Verdict.ERROR, "asynchronous"),
    ("aten::rsqrt", F32, "native", Verdict.NATIVE, "agrees"),  # right after the async error: clean
    ("aten::round", F32, "segfault", Verdict.CRASH, "SIGSEGV"),
    ("aten::trunc", F32, "native", Verdict.NATIVE, "agrees"),  # right after the segfault: completed
    ("aten::frac", F32, "unsupported_abort", Verdict.CRASH, "SIGABRT"),  # signal in the on pass
    ("aten::sign", F32, "abort", Verdict.CRASH, "SIGABRT"),
    ("aten::erf", F32, "hang", Verdict.TIMEOUT, "no answer within"),
    ("aten::relu", F64, "native", Verdict.UNSUPPORTED_DTYPE, "float64"),
    ("aten::take", (F32, TensorSpec("int64", (4,), (1,))), "native", Verdict.UNKNOWN,
     "no values were recorded for index"),
    ("aten::erfc", F32, "native", Verdict.NATIVE, "agrees"),
]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """(folder, the simulator's DeviceDouble with the batch's script); the fallback variable unset meanwhile."""
    folder = tmp_path_factory.mktemp("sim")
    script = {"generation": "2.6+", "ops": {op: how for op, _, how, _, _ in BATCH}}
    script["ops"]["aten::erf"] = {"kind": "hang", "child_pid_file": str(folder / "grandchild.pid")}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
        yield folder, simulated_mps.double(script)


class Recorder(Observer):
    """Keeps the order outcomes arrive in and the environments."""

    def __init__(self):
        self.outcomes, self.environments = [], {}

    def outcome(self, outcome):
        self.outcomes.append(outcome)

    def environment(self, pass_name, record):
        self.environments[pass_name] = record


def _probe(op: str, spec):
    tensors = list(spec) if isinstance(spec, tuple) else [spec]
    return make(op, tensors, {"args": [{"t": i} for i in range(len(tensors))], "kwargs": {}})


@pytest.fixture(scope="module")
def batch_run(simulated):
    probes = [_probe(op, spec) for op, spec, *_ in BATCH]
    recorder = Recorder()
    options = RunnerOptions(device="mps", workers=1, timeout=3.0, isolation="zygote", double=simulated[1])
    start = time.monotonic()
    result = run_probes(probes, options, observer=recorder)
    return probes, result, recorder, time.monotonic() - start


@pytest.mark.parametrize("index", range(len(BATCH)), ids=[f"{b[0]}-{getattr(b[1], 'dtype', 'mixed')}-{b[3].value}" for b in BATCH])
def test_decision_table_on_simulated_mps(batch_run, index):
    probes, result, _, _ = batch_run
    probe = probes[index]
    decision = decide(result.off[probe.id], result.on.get(probe.id))
    _, _, _, verdict, words = BATCH[index]
    assert decision.verdict == verdict and words in decision.text, decision


def test_a_pooled_batch_completes_around_its_crashes_and_confirms_them_alone(batch_run):
    probes, result, recorder, _ = batch_run
    assert set(result.off) == {p.id for p in probes}  # nothing skipped after the segfault, abort or hang
    crash = result.off[probes[13].id]
    assert crash.status == "crash" and crash.confirmed.startswith("pooled run: crash (SIGSEGV")
    on_pass = {o.probe for o in recorder.outcomes if o.pass_name == "on"}
    raised = {p.id for p in probes if result.off[p.id].status == "raised"}
    assert on_pass == raised and len([o for o in recorder.outcomes if o.pass_name == "off"]) == len(probes)


def test_each_pass_ran_with_its_own_fallback_setting(batch_run):
    _, _, recorder, _ = batch_run
    assert recorder.environments["off"]["fallback_env"] == "unset"
    assert recorder.environments["on"]["fallback_env"] == "1"
    assert recorder.environments["off"]["simulated"] is True
    assert recorder.environments["off"]["backend"] == "simulated-mps (tests only)"


def test_a_timeout_kills_the_whole_process_group(batch_run, simulated):
    pid = int((simulated[0] / "grandchild.pid").read_text())
    for _ in range(50):  # the killed group's orphan is reaped by init shortly after
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the hung probe's grandchild {pid} survived the timeout")


def test_the_simulated_backend_reads_the_variable_only_at_import(monkeypatch):
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    module = importlib.reload(simulated_mps)
    try:
        monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")  # too late, as with real torch
        sim = module.SimulatedMps({"ops": {"aten::cos": "unsupported"}})
        with pytest.raises(NotImplementedError, match="not currently implemented for the MPS device"):
            sim.call(torch.ops.aten.cos.default, [torch.ones(2)], {})
        assert module.SimulatedMps({}).fallback_on is False
        assert importlib.reload(simulated_mps).FALLBACK_ON is True  # a fresh import sees it
    finally:
        monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK")
        importlib.reload(simulated_mps)


def test_the_simulated_fallback_warning_is_warn_once(recwarn):
    sim = simulated_mps.SimulatedMps({"ops": {"aten::abs": "always_cpu", "aten::neg": "always_cpu"}})
    previous = torch.is_warn_always_enabled()
    try:
        torch.set_warn_always(False)
        for op in (torch.ops.aten.abs.default, torch.ops.aten.neg.default):
            sim.call(op, [torch.ones(2)], {})
        assert len(recwarn) == 1  # TORCH_WARN_ONCE: the second op fell back silently
        torch.set_warn_always(True)
        sim.call(torch.ops.aten.neg.default, [torch.ones(2)], {})
        assert len(recwarn) == 2
    finally:
        torch.set_warn_always(previous)


def test_the_zygote_never_forks_a_backend_that_is_not_fork_safe():
    class Mps:
        name, forkable = "mps", False

    assert "not forkable" in _refusal(Mps())
    assert _refusal(simulated_mps.SimulatedMps({})) is None


def test_spawned_workers_isolate_a_crash_too(simulated):
    probe = make("aten::round", [F32], {"args": [{"t": 0}], "kwargs": {}})
    options = RunnerOptions(device="mps", workers=1, timeout=30.0, isolation="spawn", double=simulated[1])
    result = run_probes([probe], options)
    outcome = result.off[probe.id]
    assert outcome.status == "crash" and outcome.signal.startswith("SIGSEGV") and outcome.confirmed, outcome.message


def test_no_environment_variable_or_flag_can_select_a_test_double(monkeypatch):
    """The double reaches the worker only through the Python API: the old variable does nothing, the device
    check still refuses MPS off a Mac, the command line's probe options carry none, and no opscan module ever
    makes a DeviceDouble (backends.from_dict rebuilds the one a parent sent)."""
    from pathlib import Path

    from opscan.cli.scan_flags import build_parser, probe_options
    from opscan.probe import backends
    from opscan.probe.stage import ProbeEnvironmentError, check_device

    monkeypatch.setenv("OPSCAN_PROBE_BACKEND", "simulated_mps")
    assert type(backends.load_backend("cpu")) is backends.Backend
    if not torch.backends.mps.is_available():
        with pytest.raises(ProbeEnvironmentError, match="MPS is not available here"):
            check_device("mps")
    options, _ = probe_options(build_parser().parse_args(["t.py:f", "--device", "cpu"]))
    assert options.double is None
    root = Path(simulated_mps.__file__).resolve().parents[2] / "opscan"
    makers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "DeviceDouble(" in p.read_text())
    assert makers == []


def test_a_double_always_reports_itself_as_simulated():
    """Whatever a double's own record says, the worker's hello names it and marks it simulated."""
    from opscan.probe import backends

    class Shy(backends.Backend):
        name = "shy double"

        def describe(self):
            return {**super().describe(), "simulated": False, "backend": "mps"}

    record = backends.Simulated(Shy()).describe()
    assert record["simulated"] is True and record["backend"] == "shy double"
