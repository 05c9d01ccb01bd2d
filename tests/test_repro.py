"""Repro scripts, ISSUE.md files and minimisation (opscan/repro, issue #8 part 1).

Every generated script is compiled and RUN with `--device cpu` in a child process (tricky's nine in one
child, the crafted step's two in another, each as __main__ from its own file; take and the minimised script
one process each), and must exit with the code
recorded for cpu: 0 for examples/tricky.py's findings (they are MPS findings; the CPU runs them and agrees
with its float64 reference, to the same max error the probe measured), 1 for the crafted float16/bfloat16
zeta (`"zeta_cpu" not implemented for 'Half'`). Minimisation runs in the real probe workers on the
SIMULATED MPS backend (tests/simulated_mps, kind adaptive_divisible) and must find the divisibility boundary.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import jsonschema
import pytest

from opscan.cli import main as opscan_main
from opscan.probe.stage import ProbeOptions
from opscan.repro import render_files
from opscan.cli.repro import main as repro_main
from opscan.scan import ScanOptions, scan

from test_schema import load_schema

TESTS = Path(__file__).resolve().parent
TRICKY = str(TESTS.parent / "examples" / "tricky.py") + ":build_model"
CRAFTED = str(TESTS.parent / "bench" / "crafted_low_precision.py") + ":build"
TRACKING = "https://github.com/pytorch/pytorch/issues/141287"


def _measured(target: str) -> dict:
    report = scan(ScanOptions(target, probe=ProbeOptions(device="cpu", workers=2), repro=True, memory=False))
    return report.to_dict()


@pytest.fixture(scope="module")
def tricky_cpu() -> dict:
    """tricky's report measured on the CPU, with its repro section."""
    return _measured(TRICKY)


@pytest.fixture(scope="module")
def crafted_cpu() -> dict:
    """The crafted low-precision step measured on the CPU (zeta fails there in float16 and bfloat16)."""
    return _measured(CRAFTED)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> Path:
    """`opscan TRICKY --no-probe --repro -o DIR` through the real CLI: the folder it wrote."""
    out = tmp_path_factory.mktemp("predicted")
    assert opscan_main([TRICKY, "--no-probe", "--repro", "--no-memory", "-o", str(out), "-q", "-f", "json"]) == 0
    return out


def _write(files: dict[str, str], root: Path) -> list[Path]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return sorted(root / rel for rel in files if rel.endswith(".py"))


def _run_all(scripts: list[Path], device: str = "cpu") -> dict[Path, subprocess.CompletedProcess]:
    """Every script in its own process, all at once (each only imports torch)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    procs = {s: subprocess.Popen([sys.executable, str(s), "--device", device], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env, cwd=s.parent) for s in scripts}
    return {s: subprocess.CompletedProcess(p.args, p.wait(timeout=300), p.stdout.read()) for s, p in procs.items()}


# Runs many scripts in ONE child process (torch imported once, about 3 s each saved on this 2-core machine):
# each script runs as __main__ from its own file with its own globals and argv, its exit code from SystemExit.
DRIVER = """
import contextlib, io, json, runpy, sys
device, results = sys.argv[1], {}
for path in sys.argv[2:]:
    sys.argv, out = [path, "--device", device], io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
    results[path] = [code, out.getvalue()]
print(json.dumps(results))
"""


def _run_in_one_process(scripts: list[Path], device: str = "cpu") -> dict[Path, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    done = subprocess.run([sys.executable, "-c", DRIVER, device, *map(str, scripts)], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    return {Path(p): subprocess.CompletedProcess(p, code, out) for p, (code, out) in json.loads(done.stdout).items()}


def _recorded_exit(report: dict, rel: str, files: dict[str, str]) -> int:
    tree = ast.parse(files[rel])
    recorded = next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and n.targets[0].id == "RECORDED")
    return recorded["cpu"]["expected_exit"]


def test_every_tricky_script_compiles_and_exits_as_recorded_on_cpu(tricky_cpu, tmp_path):
    files = render_files(tricky_cpu)
    scripts = _write(files, tmp_path)
    ops = {f["op"] for f in tricky_cpu["repro"]["findings"]}
    # every non-native row of tricky: take and put_ (no kernel), float64 copies and add, embedding_renorm_
    # (always-CPU), both adaptive pools (shape limit), the custom op (unknown: no script, it needs the target)
    assert ops == {"aten::take", "aten::put_", "aten::copy_", "aten::add.Tensor", "aten::embedding_renorm_",
                   "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward", "tricky::scale"}
    assert len(scripts) == 9  # copy_ has three distinct calls (two rows), every other op one; tricky::scale none
    # no ISSUE.md: each of tricky's causes belongs elsewhere (report/upstream.py: float64 is documented, tricky::scale
    # is its own op, take and embedding_renorm_ go to the missing-ops tracker, adaptive pooling has known issues)
    assert "repro/tricky_scale/repro_1.py" not in files and not [k for k in files if k.endswith("ISSUE.md")]
    assert "repro/tricky_scale/ISSUE.md" in render_files(tricky_cpu, every_finding=True)  # drafted when asked
    for rel, text in files.items():
        if rel.endswith(".py"):
            compile(text, rel, "exec")
    results = _run_in_one_process(scripts)
    assert sorted(results) == scripts
    for script, done in results.items():
        rel = str(script.relative_to(tmp_path))
        assert done.returncode == _recorded_exit(tricky_cpu, rel, files) == 0, (rel, done.stdout)
        assert "not reproduced: exit 0" in done.stdout
    # the script rebuilt the probe's exact inputs: put_'s max error is the one the probe measured
    put = next(f for f in tricky_cpu["ops"] if f["op"] == "aten::put_")
    put_out = results[tmp_path / "repro/aten_put_/repro_1.py"].stdout
    assert f"max abs difference {put['measured']['max_abs_err']:.3g}" in put_out


def test_crafted_float16_zeta_reproduces_on_cpu_with_exit_1(crafted_cpu, tmp_path):
    files = render_files(crafted_cpu)
    scripts = _write(files, tmp_path)
    assert [str(s.relative_to(tmp_path)) for s in scripts] == ["repro/aten_special_zeta/repro_1.py",
                                                                "repro/aten_special_zeta/repro_2.py"]
    results = _run_in_one_process(scripts)
    for script, done in results.items():
        assert done.returncode == _recorded_exit(crafted_cpu, str(script.relative_to(tmp_path)), files) == 1
    assert "raised NotImplementedError: \"zeta_cpu\" not implemented for 'Half'" in results[scripts[0]].stdout
    issue = files["repro/aten_special_zeta/ISSUE.md"]
    assert issue.splitlines()[2] == "# [CPU] `aten::special_zeta` fails for `float16`, `float16`; `bfloat16`, `bfloat16` on CPU"
    assert "result: raised NotImplementedError: \"zeta_cpu\" not implemented for 'Half'" in issue  # recorded output
    jsonschema.Draft202012Validator(load_schema()).validate(crafted_cpu)


def test_predicted_scan_writes_scripts_and_issues(predicted):
    report = json.loads((predicted / "report.json").read_text())
    jsonschema.Draft202012Validator(load_schema()).validate(report)
    assert report["repro"]["measured_on"] is None and report["repro"]["command"].endswith("--no-probe --repro")
    written = sorted(str(p.relative_to(predicted)) for p in (predicted / "repro").rglob("*") if p.is_file())
    assert written == sorted(render_files(report))  # the CLI wrote exactly what render_files gives
    take = (predicted / "repro/aten_take/repro_1.py").read_text()
    assert "'values': [0, 5, 9, 14, 20, 27]" in take  # the recorded indices, inline
    assert not (predicted / "repro/aten_take/ISSUE.md").exists()  # for the missing-ops tracker: linked, not drafted
    drafts = render_files(report, every_finding=True)  # `opscan repro --draft`: drafted, headed by why not
    issue = drafts["repro/aten_take/ISSUE.md"]
    assert issue.splitlines()[2].startswith("> **opscan would not file this as a new issue**: `PyTorch collects")
    assert "# [MPS] `aten::take` is not implemented for the MPS device" in issue.splitlines()
    assert TRACKING in issue and "### 🐛 Describe the bug" in issue and "### Versions" in issue
    assert "python -m torch.utils.collect_env" in issue and "PYTORCH_ENABLE_MPS_FALLBACK:" in issue
    pool = drafts["repro/aten__adaptive_avg_pool2d/ISSUE.md"]
    assert TRACKING not in pool and "pytorch/pytorch#97109" in pool  # not a missing kernel: its known issues
    done = _run_all([predicted / "repro/aten_take/repro_1.py"])
    assert [d.returncode for d in done.values()] == [0]  # the CPU has take: nothing to reproduce there
    mps = _run_all([predicted / "repro/aten_take/repro_1.py"], device="mps")  # no Mac here: cannot run
    assert [(d.returncode, d.stdout.splitlines()[-1]) for d in mps.values()] == [
        (2, "cannot run here: MPS is not available on this machine (it needs a Mac with Apple Silicon)")]


HOSTILE = "evil'''\"\"\"\n)\nimport os; os.system('echo pwned')  # ```` `x`:build_model"


def test_render_is_deterministic_and_user_text_stays_inside_literals(predicted):
    report = json.loads((predicted / "report.json").read_text())
    assert render_files(report) == render_files(json.loads(json.dumps(report)))
    report["model"] = HOSTILE
    report["repro"]["command"] = "opscan " + HOSTILE
    files = render_files(report)
    for rel, text in files.items():
        if not rel.endswith(".py"):
            continue
        compile(text, rel, "exec")
        tree = ast.parse(text)
        model = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "MODEL")
        assert ast.literal_eval(model) == HOSTILE
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if "pwned" in tok.string or "evil" in tok.string:
                assert tok.type == tokenize.STRING, (rel, tok)
    issue = render_files(report, every_finding=True)["repro/aten_take/ISSUE.md"]
    assert "`````\nopscan evil" in issue  # a fence longer than the command's own backtick runs


def test_every_script_carries_the_probe_comparison_byte_for_byte(predicted):
    """One comparator: the probe worker's comparison module is the text every script runs, unchanged (so its
    tolerances, its elementwise/properties choice and PyTorch's fallback-warning text exist once)."""
    from importlib import resources

    from opscan.probe import comparison, protocol

    source = resources.files("opscan.probe").joinpath("comparison.py").read_bytes()
    scripts = {rel: text for rel, text in render_files(json.loads((predicted / "report.json").read_text())).items()
               if rel.endswith(".py")}
    assert scripts and all(source in text.encode("utf-8") for text in scripts.values())
    assert protocol.comparison is comparison  # the worker's Comparison records come from the same functions
    assert comparison.compare.__module__ == "opscan.probe.comparison"


def test_every_script_carries_the_probe_rebuilder_byte_for_byte(predicted):
    """One decoder: the probe worker's rebuild module (seeded tensors, recorded values, argument decoding) is the
    text every script runs, unchanged, so the worker and the scripts cannot drift apart again."""
    from importlib import resources

    from opscan.probe import rebuild, replay
    from opscan.repro import runtime

    source = resources.files("opscan.probe").joinpath("rebuild.py").read_bytes()
    scripts = {rel: text for rel, text in render_files(json.loads((predicted / "report.json").read_text())).items()
               if rel.endswith(".py")}
    assert scripts and all(source in text.encode("utf-8") for text in scripts.values())
    assert replay.materialize_args is rebuild.materialize_args and runtime.materialize_args is rebuild.materialize_args
    assert runtime.initial is rebuild.initial and replay.initial is rebuild.initial


@pytest.fixture
def simulated_adaptive(monkeypatch):
    """The SIMULATED MPS backend's DeviceDouble, adaptive pools shape-limited (handed to the Python API: the
    command line cannot select a test double)."""
    import simulated_mps

    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    return simulated_mps.double({"ops": {"aten::_adaptive_avg_pool2d": "adaptive_divisible"}})


def minimized(report_path: Path, op_text: str, double, out: Path) -> tuple:
    """What `opscan repro REPORT OP --minimize -o OUT` does, through the Python API with a test double: (the
    Minimized result, the files written)."""
    from opscan.cli.files import write_under
    from opscan.cli.repro import select
    from opscan.repro import render_op
    from opscan.repro.minimize import minimize_findings
    from opscan.target.run import RunContext

    report = json.loads(report_path.read_text())
    op, findings = select(report, op_text, [])
    done = minimize_findings(findings, "mps", 60.0, double=double)
    # adaptive pooling's cause has known issues: drafted anyway, as `opscan repro --draft` does
    return done, write_under(RunContext(), out, render_op(report, op, done.findings, "mps", every_finding=True))


def test_minimize_finds_the_adaptive_pool_divisibility_boundary(predicted, simulated_adaptive, tmp_path):
    done, written = minimized(predicted / "report.json", "aten::_adaptive_avg_pool2d", simulated_adaptive, tmp_path)
    assert done.all_minimised and done.notes == []
    # 7x7 -> 3x3: sizes 2, 4, 5, 7 fail (no multiple of 3 either way), 1, 3, 6 pass; batch and channels shrink to 1
    assert done.lines[0].startswith("aten::_adaptive_avg_pool2d [float32]: fails at [[1, 1, 2, 2]], passes at "
                                    "[[1, 1, 1, 1]]; original [[2, 4, 7, 7]] (size 7: fails at [2, 4, 5, 7], passes "
                                    "at [1, 3, 6];")
    assert done.lines[0].endswith("probes on simulated-mps (tests only))")
    # the cause's files: the pool's script, its ISSUE.md, and the script of its backward (the same line) it attaches
    assert sorted(str(p) for p in written) == [str(tmp_path / "repro/aten__adaptive_avg_pool2d/ISSUE.md"),
                                               str(tmp_path / "repro/aten__adaptive_avg_pool2d/repro_1.py"),
                                               str(tmp_path / "repro/aten__adaptive_avg_pool2d_backward/repro_1.py")]
    script = (tmp_path / "repro/aten__adaptive_avg_pool2d/repro_1.py").read_text()
    assert "ORIGINAL_SHAPES = [[2, 4, 7, 7]]" in script
    assert "'tensors': [{'dtype': 'float32', 'shape': [1, 1, 2, 2]" in script
    assert "'expected_exit': 1" in script  # recorded on the simulated backend: it raised there
    assert "passes at `[[1, 1, 1, 1]]` (originally `[[2, 4, 7, 7]]`" in (
        tmp_path / "repro/aten__adaptive_avg_pool2d/ISSUE.md").read_text()
    done = _run_all([tmp_path / "repro/aten__adaptive_avg_pool2d/repro_1.py"])
    assert [d.returncode for d in done.values()] == [0]  # the real CPU pools 2x2 -> 3x3 without complaint


def test_minimize_of_a_call_that_does_not_fail_is_not_minimised(predicted, simulated_adaptive, tmp_path):
    done, _ = minimized(predicted / "report.json", "aten::take", simulated_adaptive, tmp_path)
    assert not done.all_minimised and done.lines[0].startswith("aten::take [float32,int64]: did not fail on "
                                                               "simulated-mps")
    assert (tmp_path / "repro/aten_take/repro_1.py").is_file()  # written, unminimised


def test_minimize_on_the_command_line_exits_0_when_every_finding_was_minimised(crafted_cpu, tmp_path, capsys):
    """The CLI's exit code on a device that is here: zeta in float16 fails on the CPU at every size (no Half
    kernel), so it reproduces and shrinks to one element; exit 0."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps(crafted_cpu))
    code = repro_main([str(path), "aten::special_zeta", "--dtype", "float16", "--minimize", "--device", "cpu",
                       "-o", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0].startswith("aten::special_zeta [float16,float16]: fails at [[1, 1], [1, 1]]"), out


@pytest.mark.parametrize("argv, words", [
    (["aten::tkae"], "'aten::tkae' has no finding in this report — use one of: aten::take"),
    (["aten::take", "--dtype", "float16"], "no finding of aten::take has dtypes float16 — its signatures: "
                                           "float32,int64"),
])
def test_repro_cli_errors_are_one_line_exit_2(predicted, argv, words, capsys):
    assert repro_main([str(predicted / "report.json"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("opscan: error: ") and words in err


def test_repro_cli_refuses_reports_without_a_section_or_not_json(tmp_path, capsys):
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 1, "ops": []}))
    (tmp_path / "bad.json").write_text("{not json")
    assert repro_main([str(tmp_path / "old.json"), "aten::take"]) == 2
    assert repro_main([str(tmp_path / "bad.json"), "aten::take"]) == 2
    assert repro_main([str(tmp_path / "missing.json"), "aten::take"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "rescan with --repro" in lines[0] and "JSONDecodeError" in lines[1]
    assert "FileNotFoundError" in lines[2]


def test_the_simulated_adaptive_kind_fails_only_on_non_divisible_sizes():
    import torch

    import simulated_mps

    sim = simulated_mps.SimulatedMps({"ops": {"aten::_adaptive_avg_pool2d": "adaptive_divisible"}})
    func = torch.ops.aten._adaptive_avg_pool2d.default
    for size, fails in ((7, True), (6, False), (3, False), (2, True), (1, False)):
        x = torch.randn(1, 1, size, size)
        if fails:
            with pytest.raises(RuntimeError, match="Adaptive pool MPS"):
                sim.call(func, [x, [3, 3]], {})
        else:
            assert sim.call(func, [x, [3, 3]], {}).shape == (1, 1, 3, 3)
