"""Measured mode on a real Mac (marked `mps`; skipped elsewhere, with the reason): rows whose MPS behaviour
in torch 2.14.1 is known from mps_facts.md, measured through the real runner (spawned workers, both
passes), and resnet18's training step measured end to end."""

from __future__ import annotations

import pytest
import torch

from opscan.probe.calls import make
from opscan.probe.decide import decide
from opscan.probe.protocol import TensorSpec
from opscan.probe.runner import RunnerOptions, run_probes
from opscan.probe.stage import ProbeOptions
from opscan.scan import ScanOptions, scan
from opscan.verdict import Verdict

from conftest import EXAMPLES

pytestmark = [
    pytest.mark.mps,
    pytest.mark.skipif(not torch.backends.mps.is_available(),
                       reason="needs a Mac with MPS: torch.backends.mps.is_available() is False here"),
]

F32, F64 = TensorSpec("float32", (4, 4), (4, 1)), TensorSpec("float64", (4, 4), (4, 1))
IDS = TensorSpec("int64", (3,), (1,), [0, 5, 7])
KNOWN = [  # op, tensors, arguments, verdict in torch 2.14.1 (mps_facts.md section)
    ("aten::relu", [F32], [{"t": 0}], Verdict.NATIVE),  # MPS kernel (yaml)
    ("aten::take", [F32, IDS], [{"t": 0}, {"t": 1}], Verdict.UNSUPPORTED),  # no MPS kernel (§1.1)
    ("aten::embedding_renorm_", [TensorSpec("float32", (10, 4), (4, 1)), IDS], [{"t": 0}, {"t": 1}, 1.0, 2.0],
     Verdict.CPU_FALLBACK),  # the always-CPU list (§1.2)
    ("aten::add.Tensor", [F64, F64], [{"t": 0}, {"t": 1}], Verdict.UNSUPPORTED_DTYPE),  # float64 (§4.2)
    ("aten::_adaptive_avg_pool2d", [TensorSpec("float32", (1, 1, 7, 7), (49, 49, 7, 1))], [{"t": 0}, [3, 3]],
     Verdict.ERROR),  # non-divisible adaptive pooling (§4.4)
]


@pytest.mark.skipif(not torch.__version__.startswith("2.14."), reason="the expectations are torch 2.14's")
def test_known_rows_of_torch_2_14_on_mps():
    probes = [make(op, tensors, {"args": args, "kwargs": {}}) for op, tensors, args, _ in KNOWN]
    result = run_probes(probes, RunnerOptions(device="mps", workers=2, timeout=120))
    for probe, (op, _, _, verdict) in zip(probes, KNOWN):
        assert decide(result.off[probe.id], result.on.get(probe.id)).verdict == verdict, op


def test_resnet18_training_step_measured_on_mps():
    report = scan(ScanOptions(f"{EXAMPLES}/cnn.py:build_model", probe=ProbeOptions(device="mps")))
    assert report.mode == "measured" and report.to_dict()["measurement"]["stands_for_mps"]
    assert all(r.measured is not None and r.source.value == "measured" for r in report.rows)
