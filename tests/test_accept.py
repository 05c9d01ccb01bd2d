"""`opscan accept`, cpu against cpu: real models (torchvision resnet18, HF BERT) are accepted with a package a
second person can rerun; the --perturb self-test is caught at that tensor, module named; a buffer left out of
the state dict fails the checkpoint round trip, tensor named; a spec changes the verdict; bad input is exit 2."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
import yaml

from opscan.cli.accept import main
from opscan.accept.engine import AcceptOptions, accept

from conftest import EXAMPLES

BUFFER = f"{EXAMPLES}/accept_buffer.py:build_model"
RESNET = ["torchvision.models:resnet18", "--arg", "num_classes=10", "--input", "2x3x32x32:float32"]
PACKAGE = ("environment.json", "spec.yaml", "logs/accept.log", "comparison.json", "comparison.md", "memory.json",
           "fallbacks.json", "transfers.json", "placement.json", "checkpoint/checkpoint.pt", "verdict.json",
           "RERUN.md", "rerun.sh")


@pytest.fixture(scope="module")
def resnet_package(tmp_path_factory):
    """resnet18 accepted cpu against cpu through the CLI: (exit code, package folder, stdout)."""
    out = tmp_path_factory.mktemp("resnet") / "accept"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main([*RESNET, "--device", "cpu", "-o", str(out)])
    return code, out, stdout.getvalue()


@pytest.mark.slow
def test_resnet18_cpu_against_cpu_is_accepted_with_a_full_package(resnet_package):
    code, out, stdout = resnet_package
    assert code == 0, stdout
    for name in PACKAGE:
        assert (out / name).is_file(), name
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["accepted"] and verdict["comparisons_within_tolerance"] and verdict["round_trip_ok"]
    comparison = json.loads((out / "comparison.json").read_text())
    kinds = {row["kind"]: row for row in comparison["kinds"] if row["pair"] == "target-vs-reference"}
    # resnet18: 62 parameters, 60 buffers (3 per BatchNorm, 20 of them); gradients after the first backward only
    assert kinds["initial"]["compared"] == 122 and kinds["gradient"]["compared"] == 62
    assert kinds["parameter"]["compared"] == 62 * 3 and kinds["loss"]["compared"] == 3
    assert all(row["failed"] == 0 for row in comparison["kinds"])
    assert comparison["first_divergence"] is None and len(comparison["losses"]["target"]) == 3
    spec = yaml.safe_load((out / "spec.yaml").read_text())
    assert spec["seed"] == 0 and spec["iterations"] == 3 and "disabled" in spec["choices"]["dropout"]
    environment = json.loads((out / "environment.json").read_text())
    assert environment["target"]["device"] == "cpu" and environment["packages"]["torch"]
    memory = json.loads((out / "memory.json").read_text())
    assert {m["phase"] for m in memory["target"]} >= {"forward", "loss", "backward", "optimizer", "eval", "checkpoint"}
    state = torch.load(out / "checkpoint/checkpoint.pt", weights_only=True)
    assert set(state) == {"model", "optimizer"} and "fc.weight" in state["model"]
    assert "--spec" in (out / "rerun.sh").read_text() and "opscan accept" in (out / "RERUN.md").read_text()
    assert "first divergence: none" in stdout and "verdict: ACCEPTED (exit 0" in stdout


@pytest.mark.slow
def test_bert_cpu_against_cpu_passes_with_dropout_disabled_and_said():
    result = accept(AcceptOptions(f"{EXAMPLES}/hf_bert.py:build_model", device="cpu", reference="cpu"))
    assert result.failures == () and result.exit_code == 0
    # 2 layers x (attention probs, attention output, FFN output) + embeddings + classifier = 8 dropout modules
    assert result.target_run.dropout["modules"] == 8 and "8 dropout module(s) set to p=0" in result.choices["dropout"]
    assert {c.kind for c in result.comparisons} == {"initial", "output", "loss", "gradient", "parameter", "buffer",
                                                   "eval"}


@pytest.mark.slow
def test_perturbation_is_caught_at_that_tensor_with_its_module(tmp_path, capsys):
    name = "layer3.0.conv1.weight"
    code = main([*RESNET, "--device", "cpu", "--perturb", name, "-o", str(tmp_path), "-q"])
    assert code == 1
    first = json.loads((tmp_path / "comparison.json").read_text())["first_divergence"]
    assert (first["iteration"], first["kind"], first["name"], first["module"]) == (0, "initial", name,
                                                                                   "layer3.0.conv1")
    assert first["max_abs_err"] == pytest.approx(1e-3, rel=1e-3)  # EPS added to every element
    out = capsys.readouterr().out
    assert f"first divergence: iteration 0, initial {name} (module layer3.0.conv1)" in out
    assert "perturbed: layer3.0.conv1.weight += 0.001 on the target only" in out


def test_buffer_left_out_of_the_state_dict_fails_the_round_trip_named(tmp_path):
    result = accept(AcceptOptions(BUFFER, device="cpu", reference="cpu"))
    assert result.first_divergence is None  # the run itself agrees; only the reload loses the buffer
    failure = result.round_trip_failure
    assert (failure.kind, failure.name, failure.module) == ("reload", "norm.scale", "norm")
    assert "non-persistent buffer" in failure.note and result.exit_code == 1
    assert result.lane.name == "linux-gpu-first" and "norm.scale" in result.lane.reasons[0]
    fixed = accept(AcceptOptions(BUFFER, args={"persistent": True}, device="cpu", reference="cpu"))
    assert fixed.round_trip_failure is None and fixed.exit_code == 0


def test_a_spec_override_changes_the_verdict(tmp_path, capsys):
    flags = [BUFFER, "--arg", "persistent=True", "--device", "cpu", "--perturb", "fc1.bias=1e-4"]
    assert main([*flags, "-o", str(tmp_path / "default"), "-q"]) == 1  # 1e-4 is beyond float32's tolerances
    loose = tmp_path / "loose.yaml"
    kinds = ("initial", "output", "loss", "gradient", "parameter", "buffer", "eval")
    loose.write_text(yaml.safe_dump({"seed": 0, "tolerances": {"float32": {k: {"rtol": 0.5} for k in kinds}}}))
    assert main([*flags, "--spec", str(loose), "-o", str(tmp_path / "loose"), "-q"]) == 0
    written = yaml.safe_load((tmp_path / "loose" / "spec.yaml").read_text())
    assert written["tolerances"]["float32"]["output"] == {"atol": 1e-5, "rtol": 0.5}  # atol kept from the defaults
    rerun = tmp_path / "rerun"
    assert main([BUFFER, "--arg", "persistent=True", "--device", "cpu", "--spec", str(tmp_path / "loose" / "spec.yaml"),
                 "-o", str(rerun), "-q"]) == 0  # the package's spec.yaml reads back


@pytest.mark.parametrize("text, words", [
    ("tolerances:\n  float32:\n    outputs: {rtol: 1}\n", "unknown key 'outputs' in tolerances.float32"),
    ("tolerances:\n  float32:\n    output: {rtol: -1}\n", "tolerances.float32.output.rtol is -1"),
    ("seed: [1\n", "is not valid YAML"),
    ("iterations: 0\n", "iterations is 0, not an integer ≥ 1"),
    ("- 1\n", "must be a mapping"),
])
def test_a_bad_spec_is_exit_2_with_one_line(tmp_path, capsys, text, words):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main([BUFFER, "--device", "cpu", "--spec", str(spec), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opscan: error: ") and words in err[0] and " — " in err[0]


@pytest.mark.parametrize("flags, words", [
    (["--device", "nope"], "--device 'nope' is not one of cpu, cuda, mps"),
    (["--device", "cpu", "--perturb", "fc9.weight"], "--perturb fc9.weight: the model has no parameter"),
    (["--device", "cpu", "--perturb", "fc1.weight=big"], "'big' is not a number"),
    (["--device", "cpu", "--spec", "/nonexistent/spec.yaml"], "cannot read spec"),
])
def test_usage_errors_are_exit_2_with_one_line(tmp_path, capsys, flags, words):
    assert main([BUFFER, *flags, "-o", str(tmp_path), "-q"]) == 2  # -q: no progress line before the error
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and " — " in err[0]


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here: the mps test covers it")
def test_an_unavailable_device_is_exit_2_with_one_line(tmp_path, capsys):
    assert main([BUFFER, "--device", "mps", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opscan: error: --device mps: mps is not available on this machine — run on a machine that has "
                   "it (mps: a Mac; cuda: a GPU machine), or pass --device cpu"]


@pytest.mark.mps
@pytest.mark.skipif(not torch.backends.mps.is_available(),
                    reason="needs a Mac with MPS: torch.backends.mps.is_available() is False here")
def test_resnet18_on_mps_against_cpu_is_accepted(tmp_path):
    result = accept(AcceptOptions(f"{EXAMPLES}/accept_resnet18.py:build_model", device="mps", reference="cpu"))
    assert result.first_divergence is None and result.round_trip_failure is None
    assert result.target_run.placement.devices["parameters"] == {"mps:0": 62}


def test_the_packages_rerun_script_reproduces_the_verdict(tmp_path):
    import os
    import subprocess
    import sys

    package = tmp_path / "pkg"
    assert main([BUFFER, "--arg", "persistent=True", "--device", "cpu", "-o", str(package), "-q"]) == 0
    # issue 36: an --arg not marked --public-arg is not recorded; rerun.sh asks for it by name
    recorded = (package / "rerun.sh").read_text() + (package / "RERUN.md").read_text()
    assert "persistent=True" not in recorded and "OPSCAN_ARG_persistent" in recorded
    env = {**os.environ, "PYTHON": sys.executable, "OPSCAN_RERUN_CWD": os.getcwd()}
    done = subprocess.run(["bash", str(package / "rerun.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "OPSCAN_ARG_persistent" in done.stderr  # not set: stops, naming the variable
    env["OPSCAN_ARG_persistent"] = "True"
    done = subprocess.run(["bash", str(package / "rerun.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "pkg-rerun" / "verdict.json").read_text())
    assert again["accepted"] and again["lane"] == json.loads((package / "verdict.json").read_text())["lane"]


def test_json_output_shows_the_predicted_lane_beside_the_measured(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"lane": {"name": "dual-track", "reasons": ["aten::take [float32,int64] ..."]}}))
    code = main([BUFFER, "--arg", "persistent=True", "--device", "cpu", "--report", str(report), "-f", "json",
                 "-o", str(tmp_path / "pkg"), "-q"])
    data = json.loads(capsys.readouterr().out)  # stdout carries only the JSON
    assert code == 0 and data["verdict"]["lane"]["name"] == "mac-first"
    assert data["verdict"]["predicted"] == {"name": "dual-track", "reasons": ["aten::take [float32,int64] ..."],
                                            "report": str(report)}
    assert data["comparison"]["first_divergence"] is None and "comparisons" not in data["comparison"]
    report.write_text("{}")
    assert main([BUFFER, "--device", "cpu", "--report", str(report), "-o", str(tmp_path / "bad"), "-q"]) == 2
    assert "is not a scan's report.json" in capsys.readouterr().err
