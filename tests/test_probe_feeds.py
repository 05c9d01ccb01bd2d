"""Probe inputs a device's own forward makes (opscan/probe/feeds.py, rebuild.py's Fed; issue 24 item 4).

A backward call consumes what its forward saved (batch norm's save_mean/save_invstd, layer norm's mean/rstd,
max-pool's indices, nll_loss's total_weight). Measured on cuda, resnet18 and BERT in float16/bfloat16 reported
native_batch_norm_backward and native_layer_norm_backward as `error` ("Expected save_mean to have type Float but
got Half"): the probe replayed the half statistics the CPU's forward had saved, where cuda's own forward keeps
them in float32. Here the mirror case runs on the CPU, through the real runner and worker processes: a float16
batch-norm + layer-norm step whose recorded statistics are float32 (what cuda's forward saves) while the CPU's
half forward saves float16 and its backward refuses float32 ones ("expected scalar type Half but found Float").
The probe must now run the forward on the probe's device first and feed its outputs: the rows are native.
The simulated MPS backend (tests only) checks what only MPS shows: a forward that MPS refuses or runs through
the CPU fallback is not the backward's failure or fallback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import simulated_mps
from helpers_trace import run_trace
from opscan.mps_view import mps_view
from opscan.probe import reconcile
from opscan.probe.calls import make, plan
from opscan.probe.decide import decide
from opscan.probe.protocol import ProbeCall
from opscan.probe.runner import RunnerOptions, run_probes
from opscan.probe.shrink import apply, cap
from opscan.repro.script import script_text
from opscan.repro.section import call_entry
from opscan.trace import TraceOptions
from opscan.verdict import Verdict

BN_BACKWARD, LN_BACKWARD = "aten::native_batch_norm_backward", "aten::native_layer_norm_backward"
SAVED_AT = {"aten::native_batch_norm": (1, 2), "aten::native_layer_norm": (1, 2)}  # output positions saved


class NormStep(torch.nn.Module):
    """Batch norm then layer norm: the two forwards whose saved statistics cuda keeps in float32."""

    def __init__(self):
        super().__init__()
        self.bn, self.ln = torch.nn.BatchNorm1d(16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.ln(self.bn(x))


@pytest.fixture(scope="module")
def half_trace():
    """A float16 training step of NormStep, traced on the CPU (its statistics are saved in float16)."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    return run_trace(NormStep(), (x,), TraceOptions(dtype="float16"))


def saved_in_float32(trace):
    """The trace as a forward that keeps its statistics in float32 would have recorded it (cuda's forward does,
    for float16 input): the forwards' saved outputs and the backwards' matching inputs become float32."""
    stats = {t.storage for c in trace.calls if c.op.display in SAVED_AT
             for i, t in enumerate(c.outputs) if i in SAVED_AT[c.op.display]}
    assert len(stats) == 4  # save_mean, save_invstd; mean, rstd

    def widened(metas):
        return tuple(replace(m, dtype="float32", nbytes=m.nbytes * 2) if m.storage in stats else m for m in metas)

    calls = tuple(replace(c, inputs=widened(c.inputs), outputs=widened(c.outputs)) for c in trace.calls)
    return replace(trace, calls=calls)


def _norm_probes(p) -> list[ProbeCall]:
    return [probe for probe in p.probes if probe.op in (BN_BACKWARD, LN_BACKWARD)]


def test_the_statistics_of_a_float32_saving_forward_are_made_by_the_cpus_own_forward(half_trace):
    trace = saved_in_float32(half_trace)
    made = plan(trace, mps_view(trace), "cpu")
    probes = _norm_probes(made)
    assert sorted(p.op for p in probes) == [BN_BACKWARD, LN_BACKWARD]
    for probe in probes:  # the recorded statistics are float32, and the forward that makes them rides along
        assert probe.feed is not None and probe.feed.op in SAVED_AT, probe
        fed = [i for i, _ in probe.feed.outputs]
        assert len(fed) == 2 and {probe.tensors[i].dtype for i in fed} == {"float32"}
        assert (0, 1) in probe.feed.shared  # the forward's input is the backward's `input` (one tensor)
    result = run_probes(list(made.probes), RunnerOptions(device="cpu", workers=1, timeout=120))
    for probe in probes:
        off = result.off[probe.id]
        assert off.status == "ran" and off.comparison.within, (probe.op, off.message)
        assert off.extra["feed"] == {"op": probe.feed.op, "inputs": [i for i, _ in probe.feed.outputs],
                                     "made": "cpu"}
    rows = reconcile.measure_rows(made, result, "cpu")
    assert {key[0].display: m.verdict for key, m in rows.items() if "norm_backward" in key[0].display} == {
        BN_BACKWARD: Verdict.NATIVE, LN_BACKWARD: Verdict.NATIVE}
    section = reconcile.measurement_section(made, result, RunnerOptions(), reconcile.Where("cpu", False), "zygote",
                                            None, {})
    assert section["saved_inputs"]["made"]["by aten::native_batch_norm on cpu"] == 1


def test_without_its_forward_the_backward_gets_the_recorded_statistics_and_the_cpu_refuses_them(half_trace):
    # the replay this change replaced: the probe hands the recorded float32 statistics to the CPU's half
    # backward, which refuses them (the cuda `error` rows of the issue, mirrored)
    trace = saved_in_float32(half_trace)
    bare = [make(p.op, p.tensors, p.spec) for p in _norm_probes(plan(trace, mps_view(trace), "cpu"))]
    result = run_probes(bare, RunnerOptions(device="cpu", workers=1, timeout=120))
    for probe in bare:
        off = result.off[probe.id]
        assert off.status == "raised" and "expected scalar type Half but found Float" in off.message, off
        assert decide(off, result.on.get(probe.id)).verdict == Verdict.ERROR


def test_a_feed_is_part_of_the_signature_and_crosses_the_protocol(half_trace):
    probe = _norm_probes(plan(half_trace, mps_view(half_trace), "cpu"))[0]
    assert ProbeCall.from_dict(probe.to_dict()) == probe
    assert make(probe.op, probe.tensors, probe.spec).id != probe.id  # the same call without its forward
    assert "feed" not in make(probe.op, probe.tensors, probe.spec).to_dict()  # old form kept without one


def test_capping_shrinks_the_call_and_its_forward_alike(half_trace):
    probe = next(p for p in _norm_probes(plan(half_trace, mps_view(half_trace), "cpu")) if p.op == BN_BACKWARD)
    capped = cap(probe, 64, lambda op: False)
    assert capped.shrink == {16: 8}  # [8, 16] -> [8, 8]: sizes shrink by value, in the call and its forward
    small = apply(capped)
    assert small.tensors[1].shape == small.feed.tensors[0].shape == (8, 8)
    assert small.feed.tensors[1].shape == small.tensors[2].shape == (8,)  # weight


def test_minimising_a_call_keeps_its_forward(half_trace):
    from opscan.repro.minimize import mapped

    probe = next(p for p in _norm_probes(plan(half_trace, mps_view(half_trace), "cpu")) if p.op == BN_BACKWARD)
    smaller = mapped(probe, {16: 4})
    assert smaller.feed is not None and smaller.feed.tensors[0].shape == smaller.tensors[1].shape == (8, 4)


def test_a_forward_that_cannot_be_replayed_falls_back_to_the_devices_rule(half_trace):
    # the forward's arguments were not recorded: on cuda the rule of Normalization.cu / layer_norm_kernel.cu
    # gives float32 statistics; on the CPU nothing is known beyond the recording, and the plan says so
    calls = tuple(replace(c, args_spec=None) if c.op.display in SAVED_AT else c for c in half_trace.calls)
    trace = replace(half_trace, calls=calls)
    on_cuda = plan(trace, mps_view(trace), "cuda")
    for probe in _norm_probes(on_cuda):
        assert probe.feed is None and sum(t.dtype == "float32" for t in probe.tensors) == 2, probe.tensors
        assert on_cuda.saved[probe.id].startswith("by the cuda rule: float32")
        assert "aten/src/ATen/native/cuda/" in on_cuda.saved[probe.id]
    on_cpu = plan(trace, mps_view(trace), "cpu")
    for probe in _norm_probes(on_cpu):
        assert probe.feed is None and {t.dtype for t in probe.tensors} == {"float16"}
        assert on_cpu.saved[probe.id].startswith("as recorded (the forward cannot be replayed")


@pytest.fixture(scope="module")
def simulated(half_trace):
    """Both norm backwards on the simulated MPS (tests only): batch norm's forward has no kernel, layer norm's
    forward runs through the CPU fallback; the backwards are native."""
    made = plan(half_trace, mps_view(half_trace), "mps")
    probes = _norm_probes(made)
    script = {"ops": {"aten::native_batch_norm": "unsupported", "aten::native_layer_norm": "always_cpu"}}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
        options = RunnerOptions(device="mps", workers=1, timeout=60, isolation="zygote",
                                double=simulated_mps.double(script))
        return {p.op: p for p in probes}, run_probes(probes, options)


def test_a_forward_mps_refuses_is_made_on_the_cpu_and_is_not_the_backwards_failure(simulated):
    probes, result = simulated
    off = result.off[probes[BN_BACKWARD].id]
    assert off.status == "ran" and off.comparison.within and not off.fallback_seen, off
    made = off.extra["feed"]["made"]
    assert made.startswith("cpu (the forward raised on simulated-mps (tests only): NotImplementedError: The "
                           "operator 'aten::native_batch_norm' is not currently implemented for the MPS device"), made
    assert decide(off, result.on.get(off.probe)).verdict == Verdict.NATIVE


def test_a_forwards_cpu_fallback_warning_is_not_the_backwards(simulated):
    probes, result = simulated
    off = result.off[probes[LN_BACKWARD].id]
    assert off.status == "ran" and not off.fallback_seen and off.extra["fallback_ops"] == [], off
    assert off.extra["feed"]["made"].startswith("simulated-mps (tests only); the forward warned: The operator "
                                                "'aten::native_layer_norm' is not currently supported on the MPS")
    assert decide(off, result.on.get(off.probe)).verdict == Verdict.NATIVE


def test_a_repro_script_runs_the_forward_first_as_the_probe_did(half_trace, tmp_path):
    trace = saved_in_float32(half_trace)
    probe = next(p for p in _norm_probes(plan(trace, mps_view(trace), "cpu")) if p.op == BN_BACKWARD)
    finding = {"op": BN_BACKWARD, "dtypes": [t.dtype for t in probe.tensors], "verdict": "native"}
    path = tmp_path / "repro_1.py"
    path.write_text(script_text({}, finding, call_entry(probe), path.name, "cpu"), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inputs [5, 6] made by aten::native_batch_norm on cpu" in done.stdout
    assert "within" in done.stdout and "not reproduced: exit 0" in done.stdout
