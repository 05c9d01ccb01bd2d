"""Reports that read the same run to run: one target scanned twice (in fresh processes with different hash seeds,
where a set's order would show) gives the same report, and no temporary file name reaches a row's `where`.
Found by comparing two zoo runs of one commit (bench/zoo.py --reports): HuBERT's NumPy-drawn mask length changed
a row's shapes, torch.distributions' release-drift notes came out in set order, and torch_geometric's
generated templates put a fresh /tmp file name in every row's `where`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opscan.scan import ScanOptions, scan

TARGETS = Path(__file__).parent / "targets" / "determinism.py"
ROOT = Path(__file__).resolve().parents[1]


def _canonical(report) -> dict:
    data = report.to_dict()
    data.pop("environment")
    return data


def test_numpy_draws_are_seeded_before_the_step():
    first = scan(ScanOptions(f"{TARGETS}:numpy_masked", memory=False))
    second = scan(ScanOptions(f"{TARGETS}:numpy_masked", memory=False))
    assert _canonical(first) == _canonical(second)


def _scan_in_child(spec: str, hash_seed: str, release: str) -> dict:
    code = ("import json, sys; from opscan.scan import ScanOptions, scan; "
            "r = scan(ScanOptions(sys.argv[1], memory=False, torch_version=sys.argv[2])).to_dict(); "
            "r.pop('environment'); print(json.dumps(r, sort_keys=True))")
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run([sys.executable, "-c", code, spec, release], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_build_is_seeded_so_shapes_that_follow_random_weights_read_the_same():
    # what ran before the scan in the process (another model's build, a user's draws) must not change the weights
    # the factory draws: an MoE router's random weights decide the expert's batch, as in Mixtral's zoo entry
    spec = f"{TARGETS}:routed"
    code = ("import json, sys, torch; from opscan.scan import ScanOptions, scan; torch.rand(int(sys.argv[2]) * 97); "
            "r = scan(ScanOptions(sys.argv[1], memory=False)).to_dict(); r.pop('environment'); "
            "print(json.dumps(r, sort_keys=True))")
    reports = [json.loads(subprocess.run([sys.executable, "-c", code, spec, draws], capture_output=True, text=True,
                                         cwd=ROOT, check=True, timeout=600).stdout.strip().splitlines()[-1])
               for draws in ("0", "1", "7")]
    shapes = {json.dumps([r["shapes"] for r in report["ops"] if r["op"] == "aten::addmm"]) for report in reports}
    assert len(shapes) == 1 and reports[0] == reports[1] == reports[2], shapes


def test_release_drift_notes_do_not_follow_hash_order():
    # at 2.0.0 the step's Python runs through units the release lacks or wrote otherwise (missing-api and drift
    # notes, one per unit): several of them, so a set's order would show
    spec = f"{TARGETS}:new_apis"
    first, second, third = (_scan_in_child(spec, seed, "2.0.0") for seed in ("1", "2", "3"))
    assert len(first["trace"]["notes"]) >= 2, first["trace"]["notes"]
    assert first == second == third


def test_a_library_generated_file_is_the_librarys_not_the_users():
    report = scan(ScanOptions(f"{TARGETS}:generated", memory=False))
    wheres = [w for row in report.rows for w in row.where]
    assert wheres
    assert not any(w["file"].startswith(("/tmp", os.path.realpath("/tmp"))) for w in wheres), wheres
    relu = next(r for r in report.rows if r.op.name == "relu" and r.where)
    [site] = [w for w in relu.where if w["phases"] == ("forward",) or "forward" in w["phases"]]
    assert site["file"].endswith("tests/targets/determinism.py") and site["function"] == "_UsesGenerated.forward"
    assert site["via"]["file"] == "transformers/_opscan_generated_collect.py (generated)"
