"""Measured mode from the command line: a run SIGKILLed after K journal lines and continued with --resume
gives the same report as an uninterrupted run (canonical JSON without timings) and no probe twice;
a device this machine cannot probe on is exit 2 before anything is traced. Probes run on the
SIMULATED MPS backend (tests/simulated_mps, tests only), slowed a little so the kill lands mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from opscan.cli import main

from conftest import TARGETS

TESTS = Path(__file__).resolve().parent
TARGET = f"{TARGETS}/tiny.py:build_model"
K = 10


@pytest.fixture
def simulator(tmp_path, monkeypatch):
    """Every op native on the simulated MPS, 0.03 s each, for workers started by this test."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": {"kind": "native", "delay": 0.03}}))
    monkeypatch.setenv("OPSCAN_PROBE_BACKEND", "simulated_mps")
    monkeypatch.setenv("OPSCAN_SIM_MPS_SCRIPT", str(script))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _canonical(path: Path) -> str:
    doc = json.loads(path.read_text())
    doc["measurement"].pop("run")  # wall time and outcomes reused from the journal: the only run-to-run fields
    return json.dumps(doc, sort_keys=True)


def _outcomes(journal: Path) -> list[tuple[str, str]]:
    lines = [json.loads(line) for line in journal.read_text().splitlines() if line.endswith("}")]
    return [(e["probe"], e["pass_name"]) for e in lines if e["kind"] == "outcome"]


def _kill_after(proc: subprocess.Popen, journal: Path, k: int, killed: list) -> None:
    """SIGKILL the run's process group once its journal holds k outcomes (in a thread)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and len(_outcomes(journal)) >= k:
            os.killpg(proc.pid, signal.SIGKILL)
            killed.append(True)
            break
        time.sleep(0.02)
    proc.wait()


def test_sigkill_then_resume_gives_the_same_report_and_no_probe_twice(simulator, capsys):
    whole, killed = simulator / "whole", simulator / "killed"
    cmd = [sys.executable, "-m", "opscan", TARGET, "--device", "mps", "--workers", "1", "-o", str(killed), "-q"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kills: list = []
    watcher = threading.Thread(target=_kill_after, args=(proc, killed / "probes.jsonl", K, kills))
    watcher.start()  # the uninterrupted run goes on meanwhile
    assert main([TARGET, "--device", "mps", "--workers", "1", "-o", str(whole), "-f", "json", "-q"]) == 0
    watcher.join()
    assert kills, f"the run ended before {K} journal lines (rc {proc.returncode})"
    before = _outcomes(killed / "probes.jsonl")
    assert K <= len(before) < len(_outcomes(whole / "probes.jsonl"))  # killed mid-run
    assert main([TARGET, "--device", "mps", "--workers", "1", "-o", str(killed), "-f", "json", "-q",
                 "--resume"]) == 0
    after = _outcomes(killed / "probes.jsonl")
    assert after[:len(before)] == before and len(after) == len(set(after))  # nothing redone, nothing twice
    assert sorted(after) == sorted(_outcomes(whole / "probes.jsonl"))
    assert _canonical(killed / "report.json") == _canonical(whole / "report.json")
    report = json.loads((killed / "report.json").read_text())
    assert report["mode"] == "measured" and report["measurement"]["run"]["reused_outcomes"] == len(before)
    assert all(r["source"] == "measured" and r["predicted"]["verdict"] == "native" for r in report["ops"])
    capsys.readouterr()


def test_a_device_that_is_not_here_is_exit_2_before_tracing(capsys):
    assert main([TARGET, "--device", "mps"]) == 2
    err = capsys.readouterr().err
    assert "MPS is not available here" in err and "--device cpu" in err
