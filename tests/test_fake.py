"""Fake tensors: `--fake` builds and traces without allocating, and reports what a real run reports.

A fake and a real scan of the same model are compared as canonical JSON without the fields that
say how the scan ran (`environment`, `trace.fake`, `trace.notes`): rows and their verdicts,
evidence, modules, phases, shapes, counts, lane, the MPS view summary.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from conftest import EXAMPLES, TARGETS
from opscan.cli import main
from opscan.scan import ScanOptions, scan
from opscan.target.load import load_target
from opscan.trace import fake
from opscan.trace.tensors import StorageIds, describe

HOW_IT_RAN = ("fake", "notes")


def _canonical(report) -> str:
    data = copy.deepcopy(report.to_dict())
    data.pop("environment")
    for key in HOW_IT_RAN:
        data["trace"].pop(key)
    return json.dumps(data, sort_keys=True, indent=1)


@pytest.mark.parametrize("example", ["tricky.py", "llama.py", "custom_step.py"])
def test_fake_and_real_reports_are_equal(example):
    # tricky: every predicted verdict (custom op, float64, always-CPU, no kernel, shape error);
    # llama: Hugging Face LLaMA (RMSNorm, rotary, grouped-query SDPA steered to the math path), AdamW;
    # custom_step: autocast bfloat16 (layer norm with float32 weights), clip_grad_norm_'s foreach path, SGD.
    spec = f"{EXAMPLES / example}:build_model"
    faked = scan(ScanOptions(spec, fake=True))
    real = scan(ScanOptions(spec, auto_fake=False))
    assert faked.trace["fake"] is True and real.trace["fake"] is False
    assert faked.trace["notes"][0].startswith("--fake:")
    assert {"forward", "backward", "optimizer"} <= set(faked.phases)
    assert _canonical(faked) == _canonical(real)


def test_factory_and_inputs_run_inside_the_fake_mode():
    built = load_target(f"{TARGETS / 'tiny.py'}:build_model", {}, [], fake.FakeChoice(force=True))
    params = list(built.model.parameters())
    assert params and all(isinstance(p, FakeTensor) for p in params)
    assert isinstance(built.inputs, FakeTensor)
    with_input = load_target(f"{TARGETS / 'tiny.py'}:build_model", {}, [_spec("2x4:float32")],
                             fake.FakeChoice(force=True))
    assert isinstance(with_input.inputs, FakeTensor) and with_input.inputs.shape == (2, 4)


def _spec(text):
    from opscan.target.inputs import parse_input

    return parse_input(text)


def test_storage_ids_of_fake_tensors():
    ids = StorageIds()
    with fake.new_mode():
        a = torch.empty(4, 6)
        view = a.t()
        b = torch.empty(4, 6)
    assert ids.of(a) == ids.of(view) == 1  # a view shares its base's (meta) storage
    assert ids.of(b) == 2
    meta = describe(view, ids)
    assert (meta.dtype, meta.shape, meta.stride, meta.device, meta.storage, meta.nbytes) == \
        ("float32", (6, 4), (1, 6), "cpu", 1, 96)  # 24 float32 elements = 96 bytes


class DataDependent(nn.Module):
    """nonzero, a boolean mask and .item() whose results fake tensors don't know."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        picked = y[y > 0]  # aten::nonzero + aten::index: a size only real values decide
        scale = y.mean().item()  # aten::_local_scalar_dense: an unknown float, used in arithmetic only
        return y.sum() * scale + picked.sum()


class Branches(nn.Module):
    """Python `if` on a tensor's value: fake tensors can't decide it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if (y > 0).any():
            y = y * 2
        return y.sum()


def _fake_trace(model):
    from helpers_trace import make_target
    from opscan.trace import TraceOptions, trace_step

    mode = fake.new_mode()
    with mode:
        built = model()
        inputs = torch.randn(4, 8)
    target = dataclasses.replace(make_target(built, inputs), fake=fake.FakeBuild(mode, "built in the test"))
    return trace_step(target, TraceOptions(fx=False))


def test_data_dependent_sizes_are_recorded_as_unknown():
    trace = _fake_trace(DataDependent)
    index = next(c for c in trace.calls if c.op.display == "aten::index.Tensor")
    assert index.outputs[0].shape == (-1,) and index.outputs[0].nbytes == 0  # unknown: counted as no bytes
    assert {"forward", "backward", "optimizer"} <= {c.phase for c in trace.calls}  # the step went on
    assert any("recorded as -1" in n for n in trace.notes)


def test_branching_on_a_value_stops_the_step_with_a_note():
    trace = _fake_trace(Branches)
    assert trace.calls[-1].op.display == "aten::_local_scalar_dense"  # the .any() that `if` needs
    assert {c.phase for c in trace.calls} == {"forward"}
    assert "the step stopped after aten::_local_scalar_dense (module (model), forward)" in trace.notes[0]
    assert "GuardOnDataDependentSymNode" in trace.notes[0]


def test_adamw_step_counters_keep_their_values():
    # _single_tensor_adam reads step.item(); the counter is torch.tensor(0.0), a constant fake tensor
    trace = _fake_trace(DataDependent)
    items = [c for c in trace.calls if c.phase == "optimizer" and c.op.display == "aten::_local_scalar_dense"]
    assert len(items) == 2  # one per parameter (lin.weight, lin.bias)


def test_footprint_decides_the_switch():
    # 1 GiB of parameters x 4 (weights, grads, two AdamW moments) = 4 GiB: over half of 6 GiB, under half of 10
    gib = 1024**3
    assert fake.Footprint(gib, 4, 6 * gib).too_big()
    assert not fake.Footprint(gib, 4, 10 * gib).too_big()
    assert "4.0 GB" in fake.Footprint(gib, 4, 6 * gib).describe()


def test_meta_pre_pass_sizes_the_parameters():
    # Linear(10, 20): 200 weights + 20 biases, float32 = 880 bytes; bfloat16 halves it
    assert fake.meta_param_bytes(lambda: nn.Linear(10, 20), {}) == 880
    assert fake.meta_param_bytes(lambda: nn.Linear(10, 20), {}, "bfloat16") == 440
    assert fake.meta_param_bytes(lambda: 1 / 0, {}) is None  # a factory that fails on meta is not sized


def test_cli_switches_to_fake_when_ram_is_short(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(fake, "available_ram", lambda: 1000)  # bytes: any model is too big
    code = main([f"{TARGETS / 'tiny.py'}:build_model", "-o", str(tmp_path), "-f", "json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "traced with fake tensors" in err and "--no-fake forces real tensors" in err
    report = json.loads(out)
    assert report["trace"]["fake"] is True and "meta pre-pass" in report["trace"]["notes"][0]
    code = main([f"{TARGETS / 'tiny.py'}:build_model", "-o", str(tmp_path), "-f", "json", "--no-fake"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["trace"]["fake"] is False and "traced with fake" not in err


def test_cli_fake_flag(capsys, tmp_path):
    code = main([f"{TARGETS / 'tiny.py'}:build_model", "-o", str(tmp_path), "-f", "json", "--fake"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["trace"]["fake"] is True


def _normalized(trace):
    """Calls with autograd sequence numbers renumbered in order of appearance (they count per process)."""
    order: dict = {}
    for call in trace.calls:
        if call.node is not None:
            order.setdefault(call.node, len(order))
    return [dataclasses.replace(c, node=order.get(c.node), args_spec=None) for c in trace.calls]


def test_fast_fake_cache_changes_nothing(monkeypatch):
    # examples/llama.py traced with FakeTensorMode itself, then with FastFakeMode checking every hit
    # against FakeTensorMode (crosscheck raises on any difference in metadata or aliasing)
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opscan.knowledge import load_knowledge
    from opscan.scan import _fake_choice, run_trace

    def trace_with(make_mode):
        monkeypatch.setattr(fake, "new_mode", make_mode)
        options = ScanOptions(f"{EXAMPLES / 'llama.py'}:build_model", fake=True)
        target = load_target(options.target, {}, [], _fake_choice(options))
        return run_trace(target, options, load_knowledge()), target.fake.mode

    fast_mode = fake.new_mode
    plain, _ = trace_with(lambda: FakeTensorMode(allow_non_fake_inputs=True))
    checked, mode = trace_with(lambda: fast_mode(crosscheck=True))
    assert mode.hits > 500  # most calls repeat (two decoder layers, AdamW per parameter)
    assert _normalized(checked) == _normalized(plain)


DATA_DEPENDENT_TARGET = '''
import torch
from torch import nn


class Picks(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y[y > 0].sum() + y.sum()


def build_model():
    return Picks(), torch.randn(4, 8)
'''


def test_cli_report_with_data_dependent_sizes_is_valid(capsys, tmp_path):
    import jsonschema
    from importlib import resources

    target = tmp_path / "picks.py"
    target.write_text(DATA_DEPENDENT_TARGET)
    code = main([f"{target}:build_model", "--fake", "-o", str(tmp_path / "out"), "-f", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    schema = json.loads(resources.files("opscan").joinpath("schema/report-v4.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)  # -1 sizes never reach the rows' shapes
    index = next(r for r in report["ops"] if r["op"] == "aten::index")
    assert index["shapes"] == [[4, 8]]  # the mask's input; the masked result's size is unknown
    assert any("recorded as -1" in n for n in report["trace"]["notes"])


def test_real_integer_constants_keep_their_values_under_fake_mode():
    # examples/cnn.py's loss reads TARGETS, a real int64 tensor made at import: under --fake it is still real data,
    # so the probe replays the recorded labels instead of asking op_probes to invent some
    from opscan.scan import prepare
    from opscan.trace.argspec import iter_tensors

    prepared = prepare(ScanOptions(f"{EXAMPLES / 'cnn.py'}:build_model", fake=True, memory=False))
    assert prepared.target.fake is not None
    nll = next(c for c in prepared.trace.calls if c.op.display == "aten::nll_loss_forward")
    values = [ref.get("v") for ref in iter_tensors(nll.args_spec)]
    assert values[0] is None  # the log-probabilities are fake: no values
    assert values[1] == _cnn_targets()


def _cnn_targets() -> list[int]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("cnn_example_for_values", EXAMPLES / "cnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TARGETS.tolist()
