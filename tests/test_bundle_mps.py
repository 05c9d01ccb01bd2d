"""A bundle for MPS, made on this Linux machine and run by its runner on the SIMULATED MPS backend
(tests/simulated_mps, tests only): both fallback passes reach the results, the repro scripts of the predicted
findings run after the probes with their output and exit code journaled, and merge — with no MPS here — gives a
report whose differences from the prediction are printed first, that says it was simulated, and whose ISSUE.md
files show the real outputs — here, off a Mac, the scripts cannot run (exit 2, "cannot run here": no MPS), and
ISSUE.md says so instead of presenting that as the output on MPS. run.sh cannot select a test double (no variable,
no flag): the runner's Python API (remote.run) is called with it, from the bundle's own vendored sources, as run.sh
would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from opscan.cli import main
from opscan.repro import render_files

from conftest import TARGETS

TESTS = Path(__file__).resolve().parent
TARGET = f"{TARGETS}/fallback_heavy.py:build_model"
# what each repro script prints first: the op and its dtypes (the probe's), the device, torch, the variable (unset:
# the runner clears it for the scripts)
REPRO_HEADS = {"repro/aten_take/repro_1.py": "repro of aten::take [float32, int64] on mps",
               "repro/aten_put_/repro_1.py": "repro of aten::put_ [float32, int64, float32] on mps"}
NO_MPS = "cannot run here: MPS is not available on this machine (it needs a Mac with Apple Silicon)"
# the bundle's runner (remote.run, what run.sh starts) on the simulator: argv[1] the bundle, argv[2] the script
RUN_SIMULATED = f"""
import json, sys
from pathlib import Path
sys.path.append({str(TESTS)!r})
import simulated_mps
from opscan.bundle import remote
assert remote.__file__.startswith(sys.argv[1]), remote.__file__  # the bundle's own copy
sys.exit(remote.run(Path(sys.argv[1]), 1, double=simulated_mps.double(json.loads(sys.argv[2]))))
"""


def test_mps_bundle_on_the_simulated_backend_merges_measured_with_differences_first(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    assert main(["bundle", TARGET, "--workers", "1", "-o", str(bundle), "-q"]) == 0  # --device mps is the default
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["device"] == "mps" and manifest["repro"]
    assert all(e["script"].startswith("repro/") and e["probe"] for e in manifest["repro"])
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    env["PYTHONPATH"] = str(bundle / "src")  # the bundle's vendored opscan only, as run.sh sets it
    script = {"default": "native", "ops": {"aten::take": "unsupported"}}
    (bundle / "results" / "logs").mkdir(parents=True)  # run.sh's first step
    run = subprocess.run([sys.executable, "-c", RUN_SIMULATED, str(bundle), json.dumps(script)], env=env, cwd=bundle,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(raw) for raw in (bundle / "results/results.jsonl").read_text().splitlines()]
    passes = {e["pass_name"] for e in lines if e["kind"] == "outcome"}
    envs = {e["pass"]: e["environment"]["fallback_env"] for e in lines if e["kind"] == "environment"}
    assert passes == {"off", "on"} and envs == {"off": "unset", "on": "1"}
    repro = [e for e in lines if e["kind"] == "repro"]
    assert [{"script": e["script"], "probe": e["probe"]} for e in repro] == manifest["repro"]
    assert all(e["output"] for e in repro)
    assert all(isinstance(e["exit_code"], int) for e in repro)
    _check_script_runs(repro)

    capsys.readouterr()
    merged = tmp_path / "merged"
    assert main(["merge", str(bundle / "results/results.jsonl"), "-o", str(merged), "-f", "json", "-q"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["mode"] == "simulated" and report["measurement"]["passes"]["on"]["probes"] > 0
    assert report["measurement"]["device"] == "simulated-mps (tests only)" and report["measurement"]["simulated"]
    # every section says what it rests on: the simulated measurement, or the prediction
    sources = {name: report[name]["source"] for name in ("lane", "graph", "transfers", "measurement", "repro",
                                                         "upgrade", "memory")}
    assert sources == {"lane": "measured", "graph": "measured", "transfers": "measured", "measurement": "measured",
                       "repro": "measured", "upgrade": "predicted", "memory": "predicted"}
    assert all(r["source"] == "measured" for r in report["ops"])
    assert "SIMULATED" in report["measurement"]["note"]
    first = err.splitlines()
    # take's backward (put_) is predicted unsupported; the simulator runs every op but take natively
    assert first[:2] == ["predicted vs measured: 1 rows differ",
                         "≠ aten::put_ [float32,int64,float32]: predicted unsupported, measured native"], err
    take = [r for r in report["ops"] if r["op"] == "aten::take"]
    assert take and all(r["verdict"] == "unsupported" and r["source"] == "measured" for r in take)
    # take (and its backward, put_) is for PyTorch's missing-ops tracker: merge drafts no ISSUE.md (issue 35), it
    # links the tracker; a draft (`opscan repro --draft`) of each shows the Mac output of the script of ITS first
    # call, matched by probe id (the merged report's calls may be numbered otherwise than the bundle's scripts)
    data = json.loads((merged / "report.json").read_text())
    assert not list((merged / "repro").glob("*/ISSUE.md"))
    assert {f["upstream"]["kind"] for f in data["findings"]} == {"tracker"}
    by_probe = {e["probe"]: e for e in repro}
    outputs = {e["probe"]: {"device": e["device"], "exit_code": e["exit_code"], "output": e["output"],
                            "environment": e.get("environment") or {}} for e in repro}
    drafts = render_files(data, real_outputs=outputs, device="mps", every_finding=True)
    shown = 0
    for op, finding_calls in _first_calls(data).items():
        issue = drafts.get(f"repro/{op.replace('::', '_')}/ISSUE.md")
        if issue is None:  # put_: its cause is take's (one line), whose draft shows take's first call
            continue
        line = by_probe.get(finding_calls)
        if line is not None and line["exit_code"] != 2:
            assert f"Output on {line['device']} (exit code {line['exit_code']})" in issue
            assert line["output"].strip() in issue, op
            shown += 1
        elif line is not None:  # "cannot run here" is not the op's output on MPS: ISSUE.md says it did not run
            assert "Output on mps" not in issue, issue
            assert ("Not run on mps: the script could not run where the bundle ran (exit code 2, cannot run here), "
                    "so this is no output of the op; it said why:\n\n```\n" + line["output"].strip() + "\n```"
                    ) in issue, issue
            assert "(Predicted by opscan from PyTorch's MPS kernel tables" in issue  # nothing ran on MPS
            shown += 1
    assert shown >= 1


def _check_script_runs(repro: list[dict]) -> None:
    """Each script's journaled run, to the letter: which op it ran, with what, and (off a Mac) why it could not."""
    assert {e["script"] for e in repro} == set(REPRO_HEADS) and all(e["device"] == "mps" for e in repro)
    for e in repro:
        head = f"{REPRO_HEADS[e['script']]} · torch {torch.__version__} · PYTORCH_ENABLE_MPS_FALLBACK=unset\n"
        assert e["output"].startswith(head), e["output"]
        if not torch.backends.mps.is_available():  # off a Mac: the script refuses, exit 2, and says why
            assert (e["exit_code"], e["output"]) == (2, head + NO_MPS + "\n"), e
        else:  # on a Mac the scripts run the op for real
            assert e["exit_code"] in (0, 1), e


def _first_calls(report: dict) -> dict[str, str]:
    """op -> the probe id of its first replayable call (the one ISSUE.md shows)."""
    first: dict[str, str] = {}
    for finding in report["repro"]["findings"]:
        for call in finding.get("calls") or []:
            if not call.get("unbuildable"):
                first.setdefault(finding["op"], call["probe"]["id"])
    return first
