"""Repro scripts and the bundle round trip on a real Mac (marked `mps`; skipped elsewhere, with the reason).

The same flows the CPU tests run with `--device cpu` standing in for the Mac, here on MPS itself: the tricky
example's repro scripts reproduce their predicted failures on mps (exit 1) with the fallback variable unset and
set, and an MPS bundle of examples/custom_step.py runs with run.sh and merges into a measured report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opscan.cli import main

from conftest import EXAMPLES

pytestmark = [
    pytest.mark.mps,
    pytest.mark.skipif(not torch.backends.mps.is_available(),
                       reason="needs a Mac with MPS: torch.backends.mps.is_available() is False here"),
]

# predicted failures of examples/tricky.py in torch 2.14 (mps_facts.md): each script must reproduce on mps
REPRODUCES = ("aten_take", "aten_add.Tensor", "aten__adaptive_avg_pool2d")


def _script(folder: Path, op: str, fallback: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    if fallback is not None:
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = fallback
    return subprocess.run([sys.executable, str(folder / "repro" / op / "repro_1.py"), "--device", "mps"],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.skipif(not torch.__version__.startswith("2.14."), reason="the expectations are torch 2.14's")
def test_tricky_repro_scripts_reproduce_on_mps(tmp_path):
    assert main([f"{EXAMPLES}/tricky.py:build_model", "--no-probe", "--repro", "-o", str(tmp_path), "-q"]) == 0
    for op in REPRODUCES:
        for fallback in (None, "1"):
            done = _script(tmp_path, op, fallback)
            assert done.returncode == 1, (op, fallback, done.stdout, done.stderr)
    take = _script(tmp_path, "aten_take", None).stdout
    assert "not currently implemented for the MPS device" in take
    assert "fall back to run on the CPU" in _script(tmp_path, "aten_take", "1").stdout + \
        _script(tmp_path, "aten_take", "1").stderr


def test_mps_bundle_runs_and_merges_into_a_measured_report(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    assert main(["bundle", f"{EXAMPLES}/custom_step.py:build_model", "-o", str(bundle), "-q"]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTORCH_ENABLE_MPS_FALLBACK")}
    run = subprocess.run(["bash", str(bundle / "run.sh")], env={**env, "PYTHON": sys.executable,
                                                                 "OPSCAN_SKIP_COLLECT_ENV": "1"},
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "merged"
    assert main(["merge", str(bundle / "results" / "results.jsonl"), "-o", str(out), "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "measured" and report["measurement"]["stands_for_mps"] is True
    assert all(row["measured"]["device"] == "mps" for row in report["ops"])
