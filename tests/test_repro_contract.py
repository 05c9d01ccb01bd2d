"""Repro contracts (opscan/repro): real outputs paired by call, honest script exit codes, the recorded command.

- `render_files(real_outputs=...)` is keyed by probe id: tricky's aten::copy_ has two calls in one finding,
  and swapping their order (so repro_1.py is the other call) still shows each output with its own call;
- a real run that exited 2 "cannot run here" (a bundle for MPS run off a Mac) is not shown as the output on MPS:
  ISSUE.md says it did not run and why, and keeps the verdict's "predicted" note;
- a script whose setup fails (a dtype this torch lacks, recorded values that do not fit the shape) exits 2
  "cannot run here", never 1; inf/nan in a script's data compile (`float('inf')`) and the script runs;
- the section's COMMAND, parsed by opscan's own parser, gives back the ScanOptions and ProbeOptions it came from;
- `opscan repro --minimize` exits 0 only when every selected finding was minimised.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
from pathlib import Path

import pytest

from opscan.cli.scan_flags import build_parser, probe_options
from opscan.target.inputs import parse_arg
from opscan.probe.protocol import ProbeCall, TensorSpec
from opscan.probe.stage import ProbeOptions
from opscan.repro import render_files
from opscan.cli.repro import main as repro_main
from opscan.repro.section import call_entry, command_line
from opscan.scan import ScanOptions

import test_repro
from test_repro import _run_in_one_process, _write

predicted = test_repro.predicted  # fixtures: the CLI's predicted scan of tricky, the simulated MPS backend
simulated_adaptive = test_repro.simulated_adaptive

COPY_ISSUE = "repro/aten_copy_/ISSUE.md"  # a draft: float64 is a documented limitation (`opscan repro --draft`)


def _report(predicted_dir: Path) -> dict:
    return json.loads((predicted_dir / "report.json").read_text())


def _copy_calls(report: dict) -> list[dict]:
    """The calls of aten::copy_'s first finding (tricky: two, float64 -> float32)."""
    return next(f for f in report["repro"]["findings"] if f["op"] == "aten::copy_")["calls"]


def _real(text: str) -> dict:
    return {"device": "mps", "exit_code": 1, "output": text, "environment": {"macos": "15.3", "chip": "Apple M3"}}


def test_real_outputs_stay_with_their_call_when_scripts_swap_numbering(predicted):
    report = _report(predicted)
    first, second = (c["probe"]["id"] for c in _copy_calls(report)[:2])
    outputs = {first: _real("OUTPUT OF THE FIRST CALL"), second: _real("OUTPUT OF THE SECOND CALL")}
    issue = render_files(report, every_finding=True, real_outputs=outputs)[COPY_ISSUE]
    assert "OUTPUT OF THE FIRST CALL" in issue and "OUTPUT OF THE SECOND CALL" not in issue
    assert "Output on mps (exit code 1):" in issue and "- chip: `Apple M3`" in issue
    swapped = copy.deepcopy(report)
    calls = _copy_calls(swapped)
    calls[0], calls[1] = calls[1], calls[0]  # repro_1.py is now the second call (a merge numbering differently)
    files = render_files(swapped, every_finding=True, real_outputs=outputs)
    assert "OUTPUT OF THE SECOND CALL" in files[COPY_ISSUE] and "OUTPUT OF THE FIRST CALL" not in files[COPY_ISSUE]
    # only the other call ran on the Mac: repro_1.py gets no output of someone else's call
    only_second = render_files(report, every_finding=True, real_outputs={second: _real("OUTPUT OF THE SECOND CALL")})[COPY_ISSUE]
    assert "OUTPUT OF THE SECOND CALL" not in only_second and "(Not run on mps yet" in only_second
    by_path = render_files(report, every_finding=True, real_outputs={"repro/aten_copy_/repro_1.py": _real("KEYED BY PATH")})
    assert "KEYED BY PATH" not in by_path[COPY_ISSUE]  # the old key is not a call


def test_a_script_that_could_not_run_is_not_presented_as_the_output_on_mps(predicted):
    report = _report(predicted)
    first = _copy_calls(report)[0]["probe"]["id"]
    said = ("repro of aten::copy_ [float32, float64] on mps · torch 2.14.1 · PYTORCH_ENABLE_MPS_FALLBACK=unset\n"
            "cannot run here: MPS is not available on this machine (it needs a Mac with Apple Silicon)\n")
    refused = {first: {"device": "mps", "exit_code": 2, "output": said, "environment": {"device": "mps"}}}
    issue = render_files(report, every_finding=True, real_outputs=refused)[COPY_ISSUE]
    assert "Output on mps" not in issue
    assert ("Not run on mps: the script could not run where the bundle ran (exit code 2, cannot run here), so this "
            "is no output of the op; it said why:\n\n```\n" + said.strip() + "\n```\n") in issue
    assert "(Paste the script's output on mps here.)" in issue  # a predicted report recorded no probe outcome
    assert "(Predicted by opscan from PyTorch's MPS kernel tables for this release" in issue  # nothing confirmed it
    ran = render_files(report, every_finding=True, real_outputs={first: {**refused[first], "exit_code": 1}})[COPY_ISSUE]
    assert "Output on mps (exit code 1):\n\n```\n" + said.strip() in ran and "Not run on mps" not in ran
    assert "(Predicted by opscan" not in ran  # a script that ran on the device is the basis


def test_collect_env_recorded_on_the_mac_fills_the_versions_block(predicted):
    # a bundle's run.sh records `python -m torch.utils.collect_env`; merge hands it to ISSUE.md's Versions
    from opscan.bundle.merge import real_outputs
    from opscan.bundle.results import Results

    report = _report(predicted)
    first = _copy_calls(report)[0]["probe"]["id"]
    line = {"probe": first, "device": "mps", "exit_code": 1, "output": "raised", "environment": {"macos": "15.3"}}
    results = Results({}, {}, {}, {"collect_env": "PyTorch version: 2.14.1\nIs MPS available: True"},
                      {"repro/aten_copy_/repro_1.py": line}, {})
    outputs = real_outputs(results)
    assert outputs[first]["environment"] == {"macos": "15.3", "collect_env": "PyTorch version: 2.14.1\nIs MPS "
                                                                             "available: True"}
    issue = render_files(report, every_finding=True, real_outputs=outputs)[COPY_ISSUE]
    versions = issue[issue.index("### Versions"):]
    assert "PyTorch version: 2.14.1\nIs MPS available: True" in versions and "Paste the output" not in versions
    assert "- macOS: `15.3`" in versions


def _take(report: dict) -> dict:
    return next(f for f in report["repro"]["findings"] if f["op"] == "aten::take")


def _broken_and_infinite(report: dict) -> dict:
    """take with a dtype no torch has; take with 2 recorded indices for a [6] tensor; clamp(x, -inf, inf)."""
    unknown, misfit = copy.deepcopy(_take(report)), copy.deepcopy(_take(report))
    unknown["op"], misfit["op"] = "aten::take.unknown_dtype", "aten::take.misfit"
    unknown["calls"][0]["probe"]["tensors"][0]["dtype"] = "float99"
    misfit["calls"][0]["probe"]["tensors"][1]["values"] = [0, 5]
    probe = ProbeCall("clampinf", "aten::clamp", (TensorSpec("float32", (2, 3), (3, 1)),),
                      {"args": [{"t": 0}, -math.inf, {"float": "inf"}], "kwargs": {}}, 7)
    clamp = {**copy.deepcopy(_take(report)), "op": "aten::clamp", "dtypes": ["float32"], "calls": [call_entry(probe)]}
    clamp["calls"][0]["outcomes"] = {"mps": {"status": "ran", "max_abs": math.inf, "max_rel": math.nan,
                                             "within": False, "expected_exit": 1}}
    return {**report, "repro": {**report["repro"], "findings": [unknown, misfit, clamp]}}


def test_setup_failures_exit_2_and_non_finite_data_compiles(predicted, tmp_path):
    files = render_files(_broken_and_infinite(_report(predicted)))
    clamp = files["repro/aten_clamp/repro_1.py"]
    compile(clamp, "clamp.py", "exec")  # a bare `inf` would be a NameError at import
    assert "'args': [{'t': 0}, float('-inf'), {'float': 'inf'}]" in clamp
    assert "'max_abs': float('inf')," in clamp and "'max_rel': float('nan')," in clamp
    done = {s.parent.name: d for s, d in _run_in_one_process(_write(files, tmp_path)).items()}
    unknown, misfit, ran = done["aten_take.unknown_dtype"], done["aten_take.misfit"], done["aten_clamp"]
    assert (unknown.returncode, unknown.stdout.splitlines()[-1]) == (2, "cannot run here: torch "
                                                                     f"{_torch_version()} has no dtype float99")
    assert misfit.returncode == 2 and misfit.stdout.splitlines()[-1].startswith(
        "cannot run here: setting up the call failed: RuntimeError: shape '[6]' is invalid"), misfit.stdout
    assert ran.returncode == 0 and "max abs difference 0 " in ran.stdout, ran.stdout  # clamp(x, -inf, inf) == x


def _torch_version() -> str:
    import torch

    return torch.__version__


EVERY_FLAG = ScanOptions("examples/tricky.py:build_model", ("2x36:float32", "6:int64:0-71"),
                         {"width": 8, "name": "a b"}, public_args=("width", "name"), inference=True, dtype="bfloat16",
                         fx=False, auto_fake=False,
                         torch_version="2.7.0", macos="15.1",
                         probe=ProbeOptions(device="cpu", max_elements=4096, timeout=12.5), repro=True)


@pytest.mark.parametrize("options", [
    EVERY_FLAG,
    ScanOptions("m.py:f", fake=True, probe=ProbeOptions(device="cpu", max_elements=None), repro=True),
    ScanOptions("m.py:f", repro=True),
])
def test_the_recorded_command_parses_back_to_the_same_scan(options):
    command = command_line(options)
    argv = shlex.split(command)
    assert argv[0] == "opscan" and argv[-1] == "--repro"
    args = build_parser().parse_args(argv[1:])
    probe, _ = probe_options(args)
    again = ScanOptions(args.target, tuple(args.input), dict(parse_arg(a) for a in args.arg),
                        public_args=tuple(args.public_arg), inference=args.inference, dtype=args.dtype, fx=not args.no_fx, fake=args.fake,
                        auto_fake=not args.no_fake, torch_version=args.torch_version, macos=args.macos,
                        probe=probe and ProbeOptions(probe.device, probe.max_elements, timeout=probe.timeout),
                        repro=args.repro)
    assert again == options, command


def test_high_3_an_arg_not_marked_public_keeps_its_name_only():
    """Issue 36 high 3: a credential passed with --arg never reaches the recorded command line (ISSUE.md, the
    scripts); the line still parses, and a value the user marks public is kept."""
    options = ScanOptions("m.py:f", args={"token": "ghp_SECRET123", "width": 8}, public_args=("width",), repro=True)
    command = command_line(options)
    assert "ghp_SECRET123" not in command
    assert "--arg 'token=<redacted>' --arg width=8 --public-arg width" in command
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert dict(parse_arg(a) for a in args.arg) == {"token": "<redacted>", "width": 8}


def test_every_flag_appears_in_the_command():
    assert command_line(EVERY_FLAG) == (
        "opscan examples/tricky.py:build_model --input 2x36:float32 --input 6:int64:0-71 --arg width=8 "
        "--arg 'name='\"'\"'a b'\"'\"'' --public-arg width --public-arg name --inference --dtype bfloat16 --no-fx "
        "--no-fake --torch-version 2.7.0 "
        "--macos 15.1 --probe --device cpu --max-elements 4096 --probe-timeout 12.5 --repro")


def test_minimize_is_done_only_when_every_finding_was_minimised(predicted, simulated_adaptive, tmp_path, capsys):
    report = _report(predicted)
    pool = next(f for f in report["repro"]["findings"] if f["op"] == "aten::_adaptive_avg_pool2d")
    no_call = {**pool, "dtypes": ["float16"], "calls": [{**pool["calls"][0], "unbuildable": "no float16 here"}]}
    report["repro"]["findings"].append(no_call)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    done, _ = test_repro.minimized(path, "aten::_adaptive_avg_pool2d", simulated_adaptive, tmp_path)
    assert not done.all_minimised  # the float32 finding was minimised, the float16 one could not be built
    assert done.lines[0].startswith("aten::_adaptive_avg_pool2d [float32]: fails at [[1, 1, 2, 2]]")
    assert len(done.lines) == 1 and done.notes == [
        "aten::_adaptive_avg_pool2d [float16]: no call of it can be built (no float16 here); nothing to minimise"]
    # the command line: the same note on stderr, exit 1 (on cpu: a test double never comes from the command line)
    assert repro_main([str(predicted / "report.json"), "tricky::scale", "--minimize", "--device", "cpu", "-o",
                       str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("opscan: tricky::scale [float32]: no call of it can be built (")
