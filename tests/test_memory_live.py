"""Memory, live (`--memory --device cpu`): growth across iterations and its suspects, the negative control,
the device counters through fakes of torch.mps/torch.cuda, the CLI, and the accuracy benchmark's logic."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import torch

from conftest import REPO, TARGETS
from opscan.cli import main
from opscan.memory import counters
from opscan.memory.live import LiveOptions, run_live
from opscan.target.load import load_target

LEAKY = f"{TARGETS / 'leaky.py'}:build_model"


def _log(keep=None, default_step=False):
    target = load_target(LEAKY, {"keep": keep} if keep else {}, [])
    if default_step:
        target = dataclasses.replace(target, train_step=None)
    return run_live(target, LiveOptions("cpu", 5))


def test_keeping_the_loss_with_its_graph_is_flagged_and_named():
    log = _log("graph")
    assert log["growth"]["growing"] and log["growth"]["deltas_from_iteration_2"] == [4, 4, 4]  # one float32 loss
    [suspect] = log["suspects"]
    assert (suspect["op"], suspect["phase"], suspect["shape"], suspect["count"]) == ("aten::mean", "loss", [], 3)
    assert "losses.append(loss)" in log["hint"]


def test_keeping_loss_item_is_not():
    log = _log("item")
    assert not log["growth"]["growing"] and log["suspects"] == [] and log["hint"] is None


def test_adamw_state_on_the_first_step_is_not_a_leak():
    log = _log(default_step=True)
    ends = log["growth"]["end_of_iteration"]
    params = sum(p.numel() * 4 for p in load_target(LEAKY, {}, []).model.parameters())
    assert ends[0] >= 3 * params  # weights + exp_avg + exp_avg_sq from iteration 1 on
    assert not log["growth"]["growing"] and len(set(ends)) == 1
    phases = [s["phase"] for s in log["samples"] if s["iteration"] == 1]
    assert phases == ["forward", "backward", "optimizer", "end"]


class _Tracker:
    live, peak = 100, 150

    def reset_peak(self):
        self.peak = self.live


def test_device_counters_read_through_fakes(monkeypatch):
    for name, value in (("synchronize", None), ("current_allocated_memory", 1), ("driver_allocated_memory", 2),
                        ("recommended_max_memory", 3)):
        monkeypatch.setattr(torch.mps, name, lambda v=value: v)
    assert counters.read_mps(_Tracker()) == {"current_allocated_memory": 1, "driver_allocated_memory": 2,
                                             "recommended_max_memory": 3, "tensor_bytes": 100,
                                             "tensor_peak_bytes": 150}
    resets = []
    for name, value in (("synchronize", None), ("memory_allocated", 4), ("max_memory_allocated", 5),
                        ("memory_reserved", 6)):
        monkeypatch.setattr(torch.cuda, name, lambda v=value: v)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: resets.append(1))
    assert counters.read_cuda(_Tracker())["max_memory_allocated"] == 5 and resets == [1]
    assert set(counters.read_cpu(_Tracker())) >= {"tensor_bytes", "tensor_peak_bytes"}


def test_cli_memory_live_log(tmp_path, capsys):
    code = main([LEAKY, "--arg", "keep='graph'", "--memory", "--device", "cpu", "--iterations", "4",
                 "-o", str(tmp_path), "-f", "table"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Memory live on cpu, 4 iterations: growing: tensor_bytes rises by 4 bytes per iteration" in out
    live = json.loads((tmp_path / "report.json").read_text())["memory"]["live"]
    assert live["growth"]["growing"] and live["suspects"][0]["phase"] == "loss"
    assert main([LEAKY, "--memory", "--iterations", "2", "-o", str(tmp_path)]) == 2  # 3 or more
    capsys.readouterr()
    assert main([LEAKY, "--no-memory", "-o", str(tmp_path), "-f", "json"]) == 0
    assert "memory" not in json.loads(capsys.readouterr().out)


def test_accuracy_benchmark_logic_on_cpu():
    spec = importlib.util.spec_from_file_location("memory_accuracy", REPO / "bench" / "memory_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # (its dataclasses look their module up)
    spec.loader.exec_module(bench)
    # the estimate users see (fake trace, the scan's memory stage) against the steady-state peak of real CPU
    # steps counted by the tracker, with attention on MPS's math path: the same bytes
    assert bench.estimate("tiny_attention", 2) == bench.measure("tiny_attention", 2, "cpu").peak


def test_accuracy_benchmark_runs_each_case_in_fresh_processes(capsys):
    spec = importlib.util.spec_from_file_location("memory_accuracy", REPO / "bench" / "memory_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    # the estimate and the real steps each in a child interpreter; their JSON lines read back, the row printed
    assert bench.run([("tiny_attention", 2)], "cpu", 1) == (0.0, 0)
    row = capsys.readouterr().out.split()
    assert row[:2] == ["tiny_attention", "2"] and row[4] == "1.000"
    # a case whose child fails is a line saying why, counted, not a traceback that loses the table
    assert bench.run([("no_such_model", 1)], "cpu", 1) == (0.0, 1)
    assert "FAILED" in capsys.readouterr().out
