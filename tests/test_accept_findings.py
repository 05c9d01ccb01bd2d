"""`opscan accept` findings: a step that fails on the target device is exit 1 with a package (a SIMULATED
missing MPS kernel, examples/accept_unsupported.py), a reference failure stays exit 2, tensors one side lacks
fail named (both ways, in the run and in the round trip), and rerun.sh keeps a hostile folder name inert."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
from types import SimpleNamespace

import torch

from opscan.accept.checkpoint import Continued, compare_round_trip
from opscan.cli.accept import main
from opscan.accept.compare import compare_runs
from opscan.accept.package import rerun_script
from opscan.accept.run import Captured
from opscan.accept.spec import AcceptSpec

from conftest import EXAMPLES

UNSUPPORTED = f"{EXAMPLES}/accept_unsupported.py:build_model"


def test_a_step_that_fails_on_the_target_is_a_finding_with_a_package(tmp_path, capsys):
    # SIMULATED: the custom op's backward raises PyTorch's exact MPS text when its gradient is bfloat16, i.e. on
    # the target only (the reference always runs float32): the stand-in for a kernel missing on the device
    out = tmp_path / "pkg"
    code = main([UNSUPPORTED, "--device", "cpu", "--dtype", "bfloat16", "--arg", "unsupported_on=bfloat16",
                 "-o", str(out), "-q"])
    assert code == 1
    verdict = json.loads((out / "verdict.json").read_text())
    reason = ("the step fails on cpu in iteration 1, backward: aten::put_ is not implemented there — "
              "NotImplementedError: The operator 'aten::put_' is not currently implemented for the MPS device.")
    assert verdict["target_failure"] == reason and verdict["lane"]["name"] == "linux-gpu-first"
    assert verdict["lane"]["reasons"][0] == reason and verdict["exit_code"] == 1 and not verdict["accepted"]
    assert verdict["round_trip_ok"] is None  # never reached
    comparison = json.loads((out / "comparison.json").read_text())
    compared = [(c["iteration"], c["kind"], c["name"]) for c in comparison["comparisons"]]
    # up to where it stopped: the initial state (the root's table first, then fc's; the index buffer), then
    # iteration 1's forward: its output and loss
    assert compared == [(0, "initial", "table"), (0, "initial", "fc.weight"), (0, "initial", "fc.bias"),
                        (0, "initial", "index"), (1, "output", "output"), (1, "loss", "loss")]
    assert all(c["ok"] for c in comparison["comparisons"])  # nothing it never reached is called missing
    memory = json.loads((out / "memory.json").read_text())
    assert [(m["iteration"], m["phase"]) for m in memory["target"]] == [(1, "forward"), (1, "loss")]
    assert not (out / "checkpoint").exists() and (out / "placement.json").is_file() and (out / "rerun.sh").is_file()
    assert f"target run: STOPPED — {reason}" in capsys.readouterr().out


def test_the_same_model_is_accepted_where_the_op_is_implemented(tmp_path):
    assert main([UNSUPPORTED, "--device", "cpu", "-o", str(tmp_path), "-q"]) == 0


def test_a_failure_on_the_reference_stays_a_usage_error(tmp_path, capsys):
    # the reference (float32) raises, the target (bfloat16) does not: the model itself is broken there
    code = main([UNSUPPORTED, "--device", "cpu", "--dtype", "bfloat16", "--arg", "unsupported_on=float32",
                 "-o", str(tmp_path / "pkg"), "-q"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NotImplementedError: The operator 'aten::put_'" in err[0]
    assert not (tmp_path / "pkg" / "verdict.json").exists()


def _run(*captured: Captured):
    return SimpleNamespace(captured=captured, dtype="float32", module_outputs={})


def _c(iteration, kind, name, value=1.0):
    return Captured(iteration, kind, name, name.rpartition(".")[0], torch.full((3,), value))


def test_a_tensor_either_side_lacks_fails_named():
    target = _run(_c(1, "output", "output"), _c(1, "loss", "loss"), _c(1, "gradient", "fc.weight"))
    reference = _run(_c(1, "loss", "loss"), _c(1, "gradient", "fc.weight"), _c(1, "gradient", "fc.bias"))
    found = {(c.kind, c.name): c for c in compare_runs(target, reference, AcceptSpec())}
    assert found[("loss", "loss")].ok and found[("gradient", "fc.weight")].ok
    no_grad = found[("gradient", "fc.bias")]  # a .grad that is None on the target
    assert not no_grad.ok and no_grad.note == "missing on the target (the reference has it)"
    assert no_grad.module == "fc" and math.isinf(no_grad.rel_err)
    extra = found[("output", "output")]
    assert not extra.ok and extra.note == "missing on the reference (the target has it)"
    order = [(c.kind, c.name) for c in compare_runs(target, reference, AcceptSpec())]
    assert order == [("output", "output"), ("loss", "loss"), ("gradient", "fc.weight"), ("gradient", "fc.bias")]
    stopped = compare_runs(target, reference, AcceptSpec(), stopped=True)  # a run that raised: only what it has
    assert [(c.kind, c.name) for c in stopped if not c.ok] == [("output", "output")]


def test_the_round_trip_compares_both_ways():
    original = Continued("original", (_c(4, "reload", "fc.weight"), _c(4, "loss", "loss")))
    reloaded = Continued("target", (_c(4, "reload", "fc.weight"), _c(4, "output", "output")))
    found = compare_round_trip(original, (reloaded,), "float32", AcceptSpec(), {"fc.weight"})
    notes = {(c.kind, c.name): (c.ok, c.note) for c in found}
    assert notes == {("reload", "fc.weight"): (True, ""),
                     ("output", "output"): (False, "missing on the original run (the reloaded target has it)"),
                     ("loss", "loss"): (False, "missing on the reloaded target (the original run has it)")}


def test_rerun_sh_keeps_a_hostile_folder_name_and_arguments_inert(tmp_path):
    hostile = tmp_path / "we}ird $(touch PWNED1) `touch PWNED2` ${HOME} 'q\" dir"
    hostile.mkdir()
    options = SimpleNamespace(target="my models/$(touch PWNED3).py:build", device="cpu", reference="cpu",
                              args={"name": "`touch PWNED4`"}, inputs=("2x3:float32",), dtype="float32",
                              allow_tf32=False, perturb=None, fail_on_lane="linux-gpu-first",
                              public_args=("name",))  # a public --arg: its hostile value is written, inert
    package = tmp_path / "pkg"
    package.mkdir()
    script = package / "rerun.sh"
    script.write_text(rerun_script(SimpleNamespace(options=options), str(hostile)))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    stub = tmp_path / "python-stub"  # stands in for the interpreter: records where it ran and what it got
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@" > "$STUB_OUT"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "argv.txt"
    env = {k: v for k, v in os.environ.items() if k != "OPSCAN_RERUN_CWD"}
    env.update(PYTHON=str(stub), STUB_OUT=str(record))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    assert lines[0] == str(hostile)  # it changed to the folder, named verbatim
    assert lines[1:6] == ["-m", "opscan", "accept", "my models/$(touch PWNED3).py:build", "--device"]
    assert "name='`touch PWNED4`'" in lines
    assert lines[-4:] == ["--spec", f"{package}/spec.yaml", "-o", f"{package}-rerun"]
    assert not [p for p in tmp_path.rglob("PWNED*")] and not list(hostile.glob("PWNED*"))
