"""The Python API (opscan/api, issue 29): `opscan.analyze` on objects in memory leaves them exactly as they were
(real torchvision and transformers models, a custom train_step; parameters, buffers, gradients, optimizer state and
step counters, an LR scheduler, module attributes down to nested plain objects, the global RNGs), goes through
the CLI's stages (the same rows and lane as `opscan TARGET`), and renders itself in Jupyter (`_repr_html_`,
checked in headless chromium inside a notebook-like page); `opscan.supports` answers as `opscan coverage` does;
importing opscan imports no torch."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import opscan
from opscan.api.isolation import IsolationError
from opscan.errors import TargetError, UsageError
from opscan.render.notebook import NotebookReport, notebook_html
from opscan.verdict import Verdict

from conftest import EXAMPLES
from test_html import chromium

REPO = Path(__file__).resolve().parent.parent


# --- import cost and names -----------------------------------------------------------------------------------------

def test_importing_opscan_and_its_api_imports_no_torch():
    code = ("import sys, opscan, opscan.api; assert 'torch' not in sys.modules, 'torch at import'; "
            "f = opscan.analyze; assert 'torch' not in sys.modules, 'torch on attribute access'; "
            "s = opscan.supports('aten::take', release='2.14.1'); assert 'torch' not in sys.modules, 'supports'; "
            "print(f.__module__, s.verdict.value)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["opscan.api.objects", "unsupported"]


def test_every_public_name_resolves_and_nothing_else_does():
    assert sorted(opscan.__all__) == sorted(["__version__", *opscan._API])
    for name in opscan.__all__:
        assert getattr(opscan, name) is not None and name in dir(opscan)
    assert opscan.Report is __import__("opscan.report", fromlist=["Report"]).Report
    with pytest.raises(AttributeError, match="no attribute 'scan_everything'"):
        opscan.scan_everything  # noqa: B018


# --- isolation -----------------------------------------------------------------------------------------------------

def plain(value, seen=None):
    """A structure that compares equal exactly when `value` (tensors by dtype, shape and values; objects by type
    and attributes, recursively) does."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), Values(value), value.requires_grad,
                plain(value.grad, seen) if value.grad is not None else None)
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, type):
        return ("class", value.__module__, value.__qualname__)
    if id(value) in seen:
        return ("seen", type(value).__name__)
    seen.add(id(value))
    if isinstance(value, dict):
        return {repr(k) if not isinstance(k, torch.Tensor) else ("t", id(k)): plain(v, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return (type(value).__name__, [plain(v, seen) for v in value])
    if callable(value) and not hasattr(value, "__dict__"):
        return ("callable", id(value))
    if hasattr(value, "__dict__"):
        return (type(value).__name__, plain(vars(value), seen))
    return ("object", id(value))


class Values:
    """A tensor's values at the time it was taken, equal to another's when torch.equal says so."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach().clone()

    def __eq__(self, other) -> bool:
        return isinstance(other, Values) and torch.equal(self.tensor, other.tensor)

    def __repr__(self) -> str:
        return f"Values({self.tensor.dtype}, {tuple(self.tensor.shape)})"


def differences(a, b, path="") -> list[str]:
    """Where two plain() structures differ (for the assertion message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a.keys() | b.keys() for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"[:300]]


def snapshot(*objects) -> tuple:
    """Everything about the objects that analyze must not change: values (plain) and identities (which objects
    each attribute holds), plus the global random states."""
    def identities(obj):
        found = {}
        if isinstance(obj, nn.Module):
            for path, module in obj.named_modules():
                found[path] = {k: id(v) for k, v in vars(module).items()}
                found[path + " tensors"] = {k: id(v) for k, v in [*module._parameters.items(),
                                                                   *module._buffers.items()]}
        elif hasattr(obj, "__dict__"):
            found["."] = {k: id(v) for k, v in vars(obj).items()}
        return found
    import numpy

    return (plain(objects), [identities(o) for o in objects], torch.get_rng_state().tolist(),
            (random.getstate(), numpy.random.get_state()[1].tolist()))


def assert_untouched(before, *objects):
    after = snapshot(*objects)
    assert after[1] == before[1], "an attribute now holds another object"
    assert after[2] == before[2], "torch's RNG state changed"
    assert after[3] == before[3], "Python's or NumPy's random state changed"
    assert after[0] == before[0], differences(before[0], after[0])[:5]


class Settings:
    """A plain object nested in a module, as configs are."""

    def __init__(self):
        self.inner = {"scale": [1.0, 2.0], "tag": "run-1"}
        self.counter = 0


@pytest.mark.slow
def test_a_torchvision_model_with_sgd_momentum_and_a_scheduler_is_left_as_it_was():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    model.settings = Settings()
    model.fc.note = {"nested": Settings()}
    inputs = torch.randn(2, 3, 32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(inputs).sum().backward()  # one real step first: gradients, momentum buffers, a scheduler step
    optimizer.step()
    scheduler.step()
    before = snapshot(model, inputs, optimizer, scheduler)
    report = opscan.analyze(model, inputs, optimizer=optimizer, torch_version="2.14.1")
    assert_untouched(before, model, inputs, optimizer, scheduler)
    assert optimizer.param_groups[0]["lr"] == 0.05 and scheduler.last_epoch == 1
    assert isinstance(report, NotebookReport) and report.lane.name == "mac-first"
    assert {"aten::_mps_convolution", "aten::mps_convolution_backward"} <= {r.op.display for r in report.ops}
    assert report.memory is not None  # the sizing runs built their own SGD over the meta copies


@pytest.mark.slow
def test_a_transformers_model_with_adamw_step_counters_is_left_as_it_was():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = BertForSequenceClassification(config)
    inputs = {"input_ids": torch.randint(0, 64, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.int64),
              "labels": torch.tensor([0, 2])}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(**inputs).loss.backward()
    optimizer.step()  # AdamW's state now holds step counters (tensors) at 1
    before = snapshot(model, inputs, optimizer)
    steps = [s["step"].item() for s in optimizer.state.values()]
    report = opscan.analyze(model, inputs, optimizer=optimizer, memory=False)
    assert_untouched(before, model, inputs, optimizer)
    assert [s["step"].item() for s in optimizer.state.values()] == steps == [1.0] * len(steps)
    assert model.config is config and config.num_labels == 3
    assert report.trace["step"] == "train" and report.ops


class Clipped:
    """A train_step object with state of its own, a loss module with a weight, gradient clipping."""

    def __init__(self):
        self.calls = 0
        self.loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]))

    def __call__(self, model, optimizer, inputs):
        self.calls += 1
        x, y = inputs
        loss = self.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()


def test_a_custom_train_step_object_and_its_loss_module_are_left_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    inputs = (torch.randn(4, 6), torch.tensor([0, 1, 2, 1]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = Clipped()
    step(model, optimizer, inputs)  # the caller's own step: state, BatchNorm running stats, calls == 1
    before = snapshot(model, inputs, optimizer, step)
    report = opscan.analyze(model, inputs, optimizer=optimizer, train_step=step)
    assert_untouched(before, model, inputs, optimizer, step)
    assert step.calls == 1 and model[1].num_batches_tracked.item() == 1
    ops = {r.op.display for r in report.ops}
    assert "aten::_foreach_norm.Scalar" in ops or "aten::linalg_vector_norm" in ops  # the clipping was traced
    assert "aten::nll_loss_forward" in ops


def test_a_hook_that_reaches_the_callers_model_is_caught():
    model = nn.Linear(4, 2)
    original = model

    def hook(module, args, out):  # a closure over the caller's model, not the module it is called with
        with torch.no_grad():
            original.weight.mul_(2.0)

    model.register_forward_hook(hook)
    with pytest.raises(IsolationError, match=r"the scan changed your objects: model\.weight"):
        opscan.analyze(model, torch.randn(3, 4), memory=False)


def test_bad_arguments_are_one_line_target_errors():
    model = nn.Linear(4, 2)
    with pytest.raises(TargetError, match="needs an nn.Module, got function"):
        opscan.analyze(lambda x: x, torch.randn(3, 4))
    with pytest.raises(TargetError, match="not a torch.optim.Optimizer"):
        opscan.analyze(model, torch.randn(3, 4), optimizer="adam")
    with pytest.raises(TargetError, match="inference=True scans the forward only"):
        opscan.analyze(model, torch.randn(3, 4), inference=True, train_step=lambda m, o, i: None)


class Exits(nn.Module):
    def forward(self, x):
        raise SystemExit(3)


def test_sys_exit_in_the_model_and_an_unknown_release_are_errors_not_the_end_of_the_kernel():
    from opscan.knowledge.loader import KnowledgeError
    from opscan.target.user_code import TargetExit

    with pytest.raises(TargetExit, match=r"the target called sys.exit\(3\) in forward"):
        opscan.analyze(Exits(), torch.randn(2, 2), inference=True, memory=False)
    with pytest.raises(KnowledgeError):
        opscan.analyze(nn.Linear(2, 2), torch.randn(2, 2), torch_version="1.0.0")


# --- the CLI's stages ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tricky():
    """examples/tricky.py analyzed from its objects, and the same target scanned as the CLI does."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import tricky as module
    finally:
        sys.path.remove(str(EXAMPLES))
    from opscan.scan import ScanOptions, scan

    model, inputs = module.build_model()
    return opscan.analyze(model, inputs, memory=False), scan(ScanOptions(f"{EXAMPLES / 'tricky.py'}:build_model",
                                                                         memory=False))


def test_analyze_gives_the_rows_and_lane_of_the_cli(tricky):
    analyzed, scanned = tricky
    # the same rows, lines of the user's code included; only the CLI has a factory to stand in for the calls opscan's
    # default step makes itself (the loss, AdamW): objects in memory have none (report/where.py)
    assert [_called(r) for r in analyzed.ops] == [_called(r) for r in scanned.ops]
    assert not any(p["by"] == "factory" for r in analyzed.ops for p in r.where)
    assert any(p["by"] == "factory" for r in scanned.ops for p in r.where)
    assert analyzed.lane == scanned.lane and analyzed.lane.name == "linux-gpu-first"
    assert analyzed.model == "opscan.analyze(Tricky)" and analyzed.model_name == "Tricky"


def _called(row) -> dict:
    """A row's JSON without the places a factory stands in for."""
    found = row.to_dict()
    return {**found, "where": [p for p in found["where"] if p["by"] != "factory"]}


def test_analyze_measures_in_probe_workers_when_given_a_device():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import tricky as module
    finally:
        sys.path.remove(str(EXAMPLES))
    model, inputs = module.build_model()
    report = opscan.analyze(model, inputs, device="cpu", memory=False)
    assert report.measurement["device"] == "cpu" and report.mode == "predicted"  # cpu never stands in for MPS
    take = next(r for r in report.ops if r.op.display == "aten::take")
    assert take.verdict == Verdict.UNSUPPORTED and take.measured["verdict"] == "native"  # the CPU has take


def test_the_report_names_follow_the_report_json(tricky):
    report, _ = tricky
    data = json.loads(report.to_json())
    assert data == json.loads(json.dumps(report.to_dict()))
    assert [r.to_dict() for r in report.ops] == data["ops"] and report.lane.to_dict() == data["lane"]
    # findings: one per cause (a line of the user's code and a rule), most severe first; the rows keep their detail
    ranks = [f.verdict.rank for f in report.findings]
    assert ranks == sorted(ranks, reverse=True) and min(ranks) > 0
    assert len(report.finding_rows) == sum(1 for r in report.ops if r.verdict != Verdict.NATIVE) == 9
    assert len(report.findings) == 6 and [f.to_dict() for f in report.findings] == data["findings"]
    assert report.findings[0].ops == ("aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward")


# --- Jupyter -------------------------------------------------------------------------------------------------------

HOST = """<!doctype html><html><head><meta charset="utf-8"><style>
body {{ font-family: serif; background: rgb(250, 240, 230); margin: 0; }} h2 {{ color: rgb(0, 0, 255); }}
table {{ border: 5px solid rgb(255, 0, 0); }}</style></head><body>
<h2 id="before">In [1]: report</h2><div class="jp-OutputArea-output">{output}</div><h2 id="after">In [2]:</h2>
<script>
var box = document.querySelector('.opscan-report'), style = function (q) {{ return getComputedStyle(q); }};
var graphs = box.querySelectorAll('svg.graph'), shown = Array.prototype.filter.call(graphs, function (g) {{
  var r = g.getBoundingClientRect(); return r.width > 200 && r.height > 80; }});
document.body.setAttribute('data-graphs', graphs.length + '/' + shown.length);
document.body.setAttribute('data-host-h2', style(document.getElementById('after')).color);
document.body.setAttribute('data-own-h2', style(box.querySelector('h2')).color);
document.body.setAttribute('data-host-font', style(document.getElementById('after')).fontFamily);
document.body.setAttribute('data-lane', box.querySelector('.lane').textContent);
document.body.setAttribute('data-focus', box.querySelectorAll('g.node.focus').length);
document.body.setAttribute('data-ready', 'true');
</script></body></html>"""


def test_the_report_renders_itself_in_a_notebook_page(tricky, tmp_path):
    report, _ = tricky
    output = report._repr_html_()
    assert output == notebook_html(report) and output.startswith('<div class="opscan-report"')
    assert "<script" not in output and "<html" not in output  # a fragment: Jupyter drops scripts anyway
    refs = re.findall(r'\b(?:src|href|xlink:href|action)\s*=\s*"([^"]*)"', output)
    assert all(r.startswith("#") for r in refs) and "url(" not in output
    style = re.search(r"<style>(.*?)</style>", output, re.S)[1]
    selectors = [s.strip() for rule in style.split("}") if "{" in rule for s in rule.split("{")[0].split(",")]
    assert selectors and all(s.startswith(".opscan-report") for s in selectors)  # nothing styles the notebook
    path = tmp_path / "notebook.html"
    path.write_text(HOST.format(output=output), encoding="utf-8")
    done = chromium(tmp_path, "--dump-dom", path.as_uri())
    body = re.search(r"<body([^>]*)>", done.stdout)[1]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body))
    assert attrs.get("ready") == "true", done.stderr[-2000:]
    rows = {nb["row"] for nb in report.graph["neighbourhoods"]}
    # each finding's card draws its rows' neighbourhoods: a row two lines call (tricky.py's float64 lines 59 and
    # 60 share their casts) is drawn under both causes
    drawn = sum(1 for f in report.findings for p in f.parts if p.row in rows)
    assert len(rows) >= 5 and drawn > len(rows) and attrs["graphs"] == f"{drawn}/{drawn}"  # each drawn, not blank
    assert attrs["focus"] == str(drawn) and attrs["lane"] == "linux-gpu-first"
    assert attrs["host-h2"] == "rgb(0, 0, 255)" and "serif" in attrs["host-font"]  # the notebook keeps its look
    assert attrs["own-h2"] == "rgb(29, 35, 42)"  # and the report keeps its own


def test_a_report_from_the_cli_stages_can_be_shown_too(tricky):
    _, scanned = tricky
    shown = NotebookReport.of(scanned)
    assert shown.to_dict() == scanned.to_dict() and shown._repr_html_() == notebook_html(scanned)
    assert shown.to_html().startswith("<!doctype html>")
    assert dataclasses.replace(shown, mode="predicted").__class__ is NotebookReport  # later stages keep the class


# --- one operator ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["aten::take", "aten::linalg_svd", "aten::embedding_renorm_",
                                "aten::_adaptive_avg_pool2d", "aten::add.Tensor"])
def test_supports_answers_as_opscan_coverage(op, capsys):
    from opscan.cli.coverage import main as coverage_main

    assert coverage_main(["--op", op, "--torch-version", "2.14.1", "-f", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["ops"]
               if opscan.supports(op).op == (r["op"] if r["overload"] == "default" else f"{r['op']}.{r['overload']}"))
    found = opscan.supports(op, release="2.14.1")
    assert (found.verdict.value, found.since, found.kernel, found.evidence.to_dict()) == (
        row["status"], row["since"], row["kernel"], row["evidence"])


def test_supports_with_dtypes_and_spellings():
    float64 = opscan.supports("aten::add.Tensor", ["float64", "float64"], release="2.14.1")
    assert float64.verdict == Verdict.UNSUPPORTED_DTYPE and float64.evidence.rule == "dtype-float64"
    bf16 = opscan.supports("aten::mm", "bfloat16", release="2.2.0")
    assert (bf16.verdict, bf16.evidence.rule, bf16.dtypes) == (Verdict.UNSUPPORTED_DTYPE, "dtype-release",
                                                               ("bfloat16",))
    assert bf16.since is not None and not bf16.native
    assert opscan.supports(torch.ops.aten.take.default, release="2.14.1") == \
        opscan.supports(torch.ops.aten.take, release="2.14.1") == opscan.supports("take", release="2.14.1")
    assert opscan.supports("aten::take", release="2.14.1").to_dict()["overload"] == "default"
    with pytest.raises(AttributeError):
        opscan.supports("aten::take").verdict = Verdict.NATIVE  # frozen


@pytest.mark.parametrize("op, words", [("aten::add", "its overloads are aten::add.Scalar"),
                                       ("not an op!", "is not an operator name"),
                                       ("aten::tkae", "`opscan coverage --op NAME` lists them")])
def test_supports_refuses_unknown_operators_in_one_line(op, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        opscan.supports(op)
