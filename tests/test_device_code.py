"""Issue 33, "code that picks a device": the user's code traced as a Mac runs it.

Crafted targets, one per pattern, each written into its own folder and scanned (predicted, no memory stage): the
finding's rule, line and effect, the lane reason it adds, and that the step still traces. A simulated CUDA host
(torch.cuda answering True, torch.backends.mps False, monkeypatched) gives the same report as this host. The
knowledge table covers every rule for every covered release. docs/trace.md, "Code that picks a device".
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from opscan.knowledge.device_code import EFFECTS, behaviour, device_table
from opscan.knowledge.loader import kb_releases as covered_releases
from opscan.scan import ScanOptions, scan
from opscan.trace.device_calls import DeviceCalls, as_mac

HEAD = "import torch\nfrom torch import nn\n\n\n"
MODEL = """
def build_model():
    return nn.Linear(4, 2), (torch.randn(3, 4),)
"""


def with_model(body: str) -> str:
    """MODEL, then `body` (indented in the test's source)."""
    return MODEL + textwrap.dedent(body)


def scanned(tmp_path, body: str, name: str = "step.py", folder: str | None = None):
    """The report of a crafted target file (HEAD + body) in its own folder (`folder`, default the file's stem)."""
    folder = tmp_path / (folder or name.removesuffix(".py"))
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(HEAD + textwrap.dedent(body))
    return scan(ScanOptions(f"{path}:build_model", memory=False))


def findings(report) -> list[dict]:
    return (report.device_code or {}).get("findings", [])


def one(report, rule: str) -> dict:
    found = [f for f in findings(report) if f["rule"] == rule]
    assert len(found) == 1, [(f["rule"], f["line"]) for f in findings(report)]
    return found[0]


def placement(report) -> list[str]:
    return [r.text for r in report.lane.why if r.kind.value == "placement"]


def line_of(report, text: str) -> int:
    path = report.model.rsplit(":", 1)[0]
    return next(n for n, line in enumerate(open(path), 1) if text in line)


def test_cuda_else_cpu_at_build_picks_the_cpu(tmp_path):
    report = scanned(tmp_path, """
        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

        def build_model():
            return nn.Linear(4, 2).to(DEVICE), (torch.randn(3, 4, device=DEVICE),)
    """)
    found = one(report, "device-pick-cpu")
    assert (found["file"], found["line"], found["function"]) == ("step.py", line_of(report, "DEVICE ="), "<module>")
    assert found["effect"] == "cpu" and found["verdict"] == "cpu_fallback" and found["phase"] == "build"
    assert "picks the CPU" in found["text"] and '"mps" if torch.backends.mps.is_available()' in found["fix"]
    assert "torch/cuda/__init__.py is_available" in found["source"]
    assert report.lane.name.value == "mac-first"  # the rows: the step on MPS, once the line picks mps
    assert placement(report)[0].startswith(f"step.py:{found['line']} runs the step on the CPU on a Mac, not on MPS")


def test_cuda_else_cpu_in_the_step_and_a_torch_device_of_it(tmp_path):
    report = scanned(tmp_path, with_model("""
        def train_step(model, optimizer, inputs):
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loss = model(inputs[0].to(device)).sum()
            loss.backward()
            optimizer.step()
    """))
    found = one(report, "device-pick-cpu")
    assert (found["line"], found["function"], found["phase"]) == (line_of(report, "torch.device("), "train_step",
                                                                  "step")
    assert len(placement(report)) == 1


def test_a_portable_pick_is_not_a_finding_and_mps_traces(tmp_path):
    """On a Mac the mps side is taken: `.to("mps")` and `device="mps"` run on the tracing host's device."""
    report = scanned(tmp_path, """
        def pick():
            if torch.cuda.is_available():
                return "cuda"
            elif torch.backends.mps.is_available():
                return "mps"
            return "cpu"

        def build_model():
            device = pick()
            return nn.Linear(4, 2).to(device), (torch.randn(3, 4, device=device),)
    """)
    assert findings(report) == [] and not placement(report)
    assert report.trace["calls"] > 0 and report.lane.name.value == "mac-first"


def test_cuda_on_a_tensor_and_a_module(tmp_path):
    report = scanned(tmp_path, """
        def build_model():
            model = nn.Linear(4, 2)
            model.cuda()
            return model, (torch.randn(3, 4),)

        def loss_fn(outputs, inputs):
            return (outputs - torch.zeros(3, 2).cuda()).pow(2).mean()
    """)
    module = one(report, "device-cuda-module")
    assert (module["line"], module["asked"], module["effect"], module["verdict"]) == (
        line_of(report, "model.cuda()"), "Module.cuda()", "raises", "error")
    assert "Torch not compiled with CUDA enabled" in module["text"] and module["fix"] == 'model.to("mps")'
    tensor = one(report, "device-cuda-tensor")
    assert (tensor["line"], tensor["phase"]) == (line_of(report, ".cuda()).pow"), "step")
    assert len(placement(report)) == 2 and report.lane.name.value == "mac-first"
    assert all("raises on a Mac as written" in text for text in placement(report))


def test_device_cuda_arguments(tmp_path):
    report = scanned(tmp_path, """
        def build_model():
            return nn.Linear(4, 2), (torch.randn(3, 4, device="cuda:0"),)

        def loss_fn(outputs, inputs):
            return (outputs - torch.ones(3, 2).to(torch.device("cuda"))).sum()
    """)
    lines = sorted(f["line"] for f in findings(report) if f["rule"] == "device-cuda-arg")
    assert lines == [line_of(report, 'device="cuda:0"'), line_of(report, 'torch.device("cuda")')]


def test_cuda_synchronize_and_empty_cache(tmp_path):
    report = scanned(tmp_path, with_model("""
        def loss_fn(outputs, inputs):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return outputs.sum()
    """))
    sync, cache = one(report, "device-cuda-synchronize"), one(report, "device-cuda-empty-cache")
    assert (sync["effect"], sync["fix"]) == ("raises", "torch.mps.synchronize()")
    assert (cache["effect"], cache["verdict"], cache["fix"]) == ("ignored", None, "torch.mps.empty_cache()")
    assert len(placement(report)) == 1  # an ignored call says what a Mac does; it adds no lane reason


def test_gradscaler_and_autocast_for_cuda(tmp_path):
    report = scanned(tmp_path, with_model("""
        SCALER = torch.amp.GradScaler("cuda")

        def train_step(model, optimizer, inputs):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(inputs[0]).sum()
            SCALER.scale(loss).backward()
            SCALER.step(optimizer)
            SCALER.update()
    """))
    scaler, region = one(report, "device-gradscaler-cuda"), one(report, "device-autocast-cuda")
    assert (scaler["line"], scaler["effect"], scaler["fix"]) == (line_of(report, "SCALER ="), "warns",
                                                                   'torch.amp.GradScaler("mps") (or torch.amp.'
                                                                   'GradScaler(x.device.type))')
    assert "Disabling autocast" in region["text"] and region["line"] == line_of(report, "torch.autocast(")
    assert not placement(report)


def test_pin_memory(tmp_path):
    report = scanned(tmp_path, with_model("""
        def loss_fn(outputs, inputs):
            target = torch.zeros(3, 2, pin_memory=True)
            return (outputs - target.pin_memory()).sum()
    """))
    asked = sorted(f["asked"] for f in findings(report) if f["rule"] == "device-pin-memory")
    assert asked == [".pin_memory()", "pin_memory=True"]
    assert all(f["confidence"] == "reported" for f in findings(report))


def test_dataloader_pin_memory_differs_per_release(tmp_path):
    body = with_model("""
        LOADER = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 4)), pin_memory=True)
    """)
    found = one(scanned(tmp_path, body), "device-pin-memory-loader")
    assert found["effect"] == "warns" and "not supported on MPS now" in found["text"]  # the installed 2.14.1
    assert behaviour("device-pin-memory-loader", "2.6.0").effect == "ignored"
    assert behaviour("device-pin-memory-loader", "2.7.0").effect == "warns"


def test_cudnn_benchmark_is_recorded_and_put_back(tmp_path):
    before = torch.backends.cudnn.benchmark
    report = scanned(tmp_path, with_model("""
        torch.backends.cudnn.benchmark = True
    """))
    found = one(report, "device-cudnn-flag")
    assert (found["asked"], found["effect"], found["line"]) == ("torch.backends.cudnn.benchmark = True", "ignored",
                                                                  line_of(report, "cudnn.benchmark"))
    assert torch.backends.cudnn.benchmark == before


def test_the_lines_that_raise_or_pick_the_cpu_are_findings_in_every_view(tmp_path):
    """A DeviceFinding with a verdict is one finding of the report (no rows: the ops are judged as they run once the
    line is fixed), shown once in the console, as a SARIF result and a GitHub annotation at its line, gated by
    --fail-on, never an ISSUE.md; one without a verdict stays in the device_code section's record."""
    import json

    from opscan.cli.common import exit_code
    from opscan.render.console import render_table
    from opscan.render.gate import baseline_from
    from opscan.render.github import render_github
    from opscan.render.junit import render_junit
    from opscan.render.sarif import render_sarif
    from opscan.repro import render_files

    report = scanned(tmp_path, with_model("""
        def loss_fn(outputs, inputs):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return outputs.sum()
    """))
    line = line_of(report, "torch.cuda.synchronize()")
    (found,) = report.findings  # the ignored empty_cache is no finding; every row is native
    assert (found.rule, found.verdict.value, found.parts, found.ops) == ("device-cuda-synchronize", "error", (), ())
    assert (found.site["file"], found.site["line"], found.site["text"]) == ("step.py", line, "torch.cuda.synchronize()")
    assert found.code.asked == "torch.cuda.synchronize()" and found.fix == "torch.mps.synchronize()"
    assert found.upstream.kind == "user-code" and not found.upstream.issue
    assert json.loads(report.to_json())["findings"][0]["code"] == {"asked": "torch.cuda.synchronize()", "calls": 1,
                                                                   "phase": "step"}
    text = render_table(report, width=200)
    assert text.count(f"[1] step.py:{line} in loss_fn: error") == 1 and "asked: torch.cuda.synchronize()" in text
    assert "\nCode that picks a device, no finding" in text and "\\x0a" not in text  # its own line, not escaped
    listed = text.split("Code that picks a device, no finding")[1]  # the record lists only the ignored call
    assert "torch.cuda.empty_cache()" in listed and "torch.cuda.synchronize()" not in listed.split("Lane")[0]
    (result,) = json.loads(render_sarif(report))["runs"][0]["results"]
    assert result["ruleId"] == "device-cuda-synchronize"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == line
    assert f"::error file=step.py,line={line},title=opscan%3A error on a Mac%3A torch.cuda.synchronize()::" in (
        render_github(report))
    assert exit_code(report, "error") == 1 and exit_code(report, "crash") == 0 and exit_code(report, None) == 0
    junit = render_junit(report, fail_on="error")
    assert 'failures="1"' in junit
    assert '<testcase classname="opscan.code" name="torch.cuda.synchronize() at step.py' in junit
    assert exit_code(report, None, baseline_from(report.to_dict(), "b.json")) == 0  # not new against itself
    assert not [p for p in render_files({**report.to_dict(), "repro": {"findings": []}}) if p.endswith("ISSUE.md")]


STEP_FOR_CUDA = MODEL.replace("return nn.Linear(4, 2)", "return nn.Linear(4, 2).to(DEVICE)") + """
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

def train_step(model, optimizer, inputs):
    x = inputs[0].to(DEVICE)
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
"""


def _simulated_cuda_host(monkeypatch) -> None:
    """This process answers as a host with one CUDA GPU (and no MPS); moving a tensor to cuda returns it as is."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)


def _comparable(report) -> dict:
    out = report.to_dict()
    for host_specific in ("environment", "model"):
        out.pop(host_specific)
    return out


def test_a_cuda_host_gives_the_report_of_one_without(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        _simulated_cuda_host(m)
        cuda_host = scanned(tmp_path, STEP_FOR_CUDA, folder="on_cuda")
        assert torch.cuda.is_available()  # the simulation outlives the scan: opscan put back what it found
    here = scanned(tmp_path, STEP_FOR_CUDA, folder="here")
    assert {f["rule"] for f in findings(here)} == {"device-pick-cpu", "device-cuda-synchronize"}
    assert _comparable(cuda_host) == _comparable(here)


def test_answers_only_while_entered_and_torch_itself_is_not_recorded():
    calls = DeviceCalls()
    with as_mac(calls):
        assert torch.cuda.is_available() is False and torch.backends.mps.is_available() is True
        assert torch.accelerator.current_accelerator() == torch.device("mps")
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
            torch.cuda._lazy_init()
        torch.manual_seed(0)  # torch's own torch.cuda.manual_seed_all: answered, not recorded
    assert [(c.rule, c.calls) for c in calls.calls()] == [("device-cuda-query", 1)]  # this test's own query
    assert torch.cuda.is_available.__module__ == "torch.cuda"


@pytest.mark.parametrize("rule", sorted(device_table()))
def test_every_rule_covers_every_release_once(rule):
    for release in covered_releases():
        known = [b for b in device_table()[rule] if b.releases.covers(release)]
        assert len(known) == 1, (rule, release)
        assert known[0].effect in EFFECTS and known[0].fix and known[0].source
