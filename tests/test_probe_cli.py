"""Measured mode, journaled: a run SIGKILLed after K journal lines and continued with resume gives the same report
as an uninterrupted run (canonical JSON without timings) and no probe twice; the command line's --resume is the
same Session; a device this machine cannot probe on is exit 2 before anything is traced. The killed runs probe on
the SIMULATED MPS backend (tests/simulated_mps, tests only), slowed a little so the kill lands mid-run; a double
reaches the probes only through the Python API, so those runs go through scan() in a child process."""

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
# scan(TARGET) with probes on the simulator (every op native, 0.03 s each), journaled in argv[1], resumed when
# argv[2] == "resume"; writes argv[1]/report.json
SIMULATED_SCAN = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
import simulated_mps
from opscan.probe.stage import ProbeOptions, ProbeSession
from opscan.render import render_json
from opscan.scan import ScanOptions, scan
out = Path(sys.argv[1])
probe = ProbeOptions(device="mps", workers=1, double=simulated_mps.double({{"default": {{"kind": "native", "delay": 0.03}}}}))
report = scan(ScanOptions({TARGET!r}, probe=probe), ProbeSession(lambda name: out, resume=sys.argv[2] == "resume"))
(out / "report.json").write_text(render_json(report))
"""


def _simulated_scan(out: Path, resume: bool = False, **popen) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTORCH_ENABLE_MPS_FALLBACK", None)
    return subprocess.Popen([sys.executable, "-c", SIMULATED_SCAN, str(out), "resume" if resume else "fresh"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, **popen)


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


def test_sigkill_then_resume_gives_the_same_report_and_no_probe_twice(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    proc = _simulated_scan(killed, stderr=subprocess.DEVNULL)
    kills: list = []
    watcher = threading.Thread(target=_kill_after, args=(proc, killed / "probes.jsonl", K, kills))
    watcher.start()  # the uninterrupted run goes on meanwhile
    assert _simulated_scan(whole, stderr=subprocess.PIPE).wait() == 0
    watcher.join()
    assert kills, f"the run ended before {K} journal lines (rc {proc.returncode})"
    before = _outcomes(killed / "probes.jsonl")
    assert K <= len(before) < len(_outcomes(whole / "probes.jsonl"))  # killed mid-run
    assert _simulated_scan(killed, resume=True, stderr=subprocess.PIPE).wait() == 0
    after = _outcomes(killed / "probes.jsonl")
    assert after[:len(before)] == before and len(after) == len(set(after))  # nothing redone, nothing twice
    assert sorted(after) == sorted(_outcomes(whole / "probes.jsonl"))
    assert _canonical(killed / "report.json") == _canonical(whole / "report.json")
    report = json.loads((killed / "report.json").read_text())
    assert report["measurement"]["run"]["reused_outcomes"] == len(before)
    # a test double: the report says so in its mode and its device, never "measured"
    assert report["mode"] == "simulated" and report["measurement"]["device"] == "simulated-mps (tests only)"
    assert report["measurement"]["simulated"] is True
    assert all(r["source"] == "measured" and r["predicted"]["verdict"] == "native" for r in report["ops"])


def test_the_command_line_resumes_its_journal(tmp_path, capsys):
    """--resume on the command line: a finished cpu run resumed reuses every outcome and probes nothing."""
    out = tmp_path / "cpu"
    assert main([TARGET, "--device", "cpu", "--workers", "1", "-o", str(out), "-f", "json", "-q"]) == 0
    first = _outcomes(out / "probes.jsonl")
    assert main([TARGET, "--device", "cpu", "--workers", "1", "-o", str(out), "-f", "json", "-q", "--resume"]) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert _outcomes(out / "probes.jsonl") == first and report["measurement"]["run"]["reused_outcomes"] == len(first)
    assert report["mode"] == "predicted" and report["measurement"]["device"] == "cpu"  # cpu never stands for MPS


def test_a_device_that_is_not_here_is_exit_2_before_tracing(capsys):
    assert main([TARGET, "--device", "mps"]) == 2
    err = capsys.readouterr().err
    assert "MPS is not available here" in err and "--device cpu" in err
