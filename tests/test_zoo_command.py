"""`opscan zoo`: manifests, the worker pool (a failing, crashing or hanging model is a row, never the end of the
run), resuming from the journal, the leaderboard's JSON/CSV/HTML, the diff, and the Ray path.

Expected lanes come from the knowledge base's records of the releases, not from the scan's output: the tiny MLP
(tests/targets/zoo_tiny.py:mlp) rolls its hidden activation with torch.roll, whose backward rolls back (the same
op, one row). In torch 2.0.0 roll has no MPS kernel (opscan/knowledge/releases/2.0.0.txt line 2348, `+op roll -`,
from the 2.0.0 macOS wheel's native_functions.yaml) and 2.1.0 adds it (releases/2.1.0.txt line 255, `+op roll M`).
The MLP is trained with AdamW, which in 2.0.x updated its first moment with mul_ + add_ (facts.yaml earlier_paths:
torch 2.0.0's torch/optim/adamw.py:389), not with lerp_ (no MPS kernel in 2.0.0, releases/2.0.0.txt `+op
lerp.Scalar_out -`), so the optimizer step does not block 2.0.0; every other op of the step (addmm, relu, mse,
their backward, AdamW's arithmetic) has had an MPS kernel since 2.0.0. So on 2.0.0 the step has exactly one
blocking row, roll unsupported (rule no-mps-kernel), in the middle of the forward and backward, and its lane is
dual-track; from 2.1.0 on it is all native and mac-first; the first native release is 2.1.0.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TARGETS
from opscan.cli import main
from opscan.zoo.board import Cell, Leaderboard, ModelResult
from opscan.zoo.models import ManifestError, ZooModel, read_manifest
from opscan.zoo.releases import BlockingRow, ReleaseResult

TINY = TARGETS / "zoo_tiny.py"
RELEASES = "2.0.0,2.1.0,2.14.1"


def manifest(tmp_path: Path, entries: str, name: str = "zoo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(entries, encoding="utf-8")
    return path


def entry(name: str, func: str, extra: str = "") -> str:
    return f"  {name}:\n    target: {TINY}:{func}\n{extra}"


def run_zoo(capsys, *argv) -> tuple[int, str, str]:
    code = main(["zoo", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- manifests


@pytest.mark.parametrize("text, says", [
    ("models: [unclosed", "is not valid YAML (line"),
    ("- just a list\n", "expected a mapping with a `models:` key"),
    ("models: {}\n", "`models` is empty"),
    (f"models:\n  a:\n    target: {TINY}:mlp\n    colour: red\n", "model a: unknown key 'colour'"),
    ("models:\n  a:\n    target: no_colon_here\n", "model a: `target` (or `factory`) must be"),
    (f"models:\n  a:\n    target: {TINY}:mlp\n    mode: fly\n", "model a: `mode` must be train or inference"),
    (f"models:\n  a:\n    target: {TINY}:mlp\n    inputs: 2x8\n", "model a: `inputs` must be a list"),
    (f"models:\n  a:\n    target: {TINY}:mlp\n    dtype: int8\n", "model a: `dtype` must be one of"),
    (f"models:\n  - name: a\n    target: {TINY}:mlp\n  - name: a\n    target: {TINY}:mlp\n",
     "model names must be unique, repeated: a"),
])
def test_a_bad_manifest_is_one_line_and_exit_2(tmp_path, capsys, text, says):
    path = manifest(tmp_path, text)
    code, out, err = run_zoo(capsys, path, "-o", tmp_path / "out", "--releases", "2.14.1")
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("opscan: error:")]
    assert len(lines) == 1 and says in lines[0] and str(path) in lines[0], err
    assert not (tmp_path / "out").exists()  # nothing written, not even the folder


def test_bad_flags_are_exit_2(tmp_path, capsys):
    path = manifest(tmp_path, "models:\n" + entry("a", "mlp"))
    code, _, err = run_zoo(capsys, path, "--releases", "1.13.0")
    assert code == 2 and "--releases: 1.13.0 — opscan knows 2.0.0 … 2.14.1 (27 releases" in err
    code, _, err = run_zoo(capsys, "no_such_family")
    assert code == 2 and "neither a family (torchvision, timm, transformers) nor a manifest" in err
    code, _, err = run_zoo(capsys, path, "--match", "zzz*", "--releases", "2.14.1", "-o", tmp_path / "o")
    assert code == 2 and "no model of" in err


def test_bench_zoo_yaml_reads_as_a_manifest():
    models = {m.name: m for m in read_manifest(REPO / "bench" / "zoo.yaml")}
    assert len(models) >= 40  # tests/test_zoo.py: the bench zoo has forty-odd architectures
    hf = models["bert"]
    assert hf.target == f"{REPO / 'bench' / 'zoo_models.py'}:hf"  # found from the manifest's folder upwards
    assert hf.args["arch"] == "BertForMaskedLM" and not hf.inference
    assert models["transformer_encoder_inference"].inference  # mode: inference
    assert models["unet3d_fp16"].dtype == "float16"
    assert models["resnet18"].inputs == ("2x3x32x32:float32",) and models["resnet18"].source == "torchvision"


def test_a_manifest_list_with_factory_and_training_keys(tmp_path):
    path = manifest(tmp_path, f"defaults: {{fake: false}}\nmodels:\n  - name: a\n    factory: {TINY}:mlp\n"
                              "    training: false\n    args: {width: 3}\n")
    (model,) = read_manifest(path)
    assert model == ZooModel("a", f"{TINY}:mlp", {"width": 3}, (), True, None, "false", "manifest")
    assert ZooModel.from_dict(model.to_dict()) == model


def test_a_manifest_error_is_a_usage_error():
    with pytest.raises(ManifestError):
        read_manifest(Path("/nonexistent/zoo.yaml"))


# ---------------------------------------------------------------- a run: rows, errors, outputs


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """One run over mlp (scans), broken (its factory raises) and crash (its worker dies): 2 workers."""
    tmp = tmp_path_factory.mktemp("zoo")
    path = manifest(tmp, "models:\n" + entry("mlp", "mlp") + entry("broken", "broken") + entry("crash", "crash"))
    out = tmp / "out"
    code = main(["zoo", str(path), "-o", str(out), "--releases", RELEASES, "--workers", "2", "-q"])
    return code, out


def test_every_model_is_a_row_and_the_run_ends_with_exit_1(scanned):
    code, out = scanned
    assert code == 1  # written, but two models are error rows
    board = json.loads((out / "leaderboard.json").read_text())
    assert board["schema"] == "opscan-zoo/1" and board["releases"] == ["2.0.0", "2.1.0", "2.14.1"]
    rows = {m["model"]["name"]: m for m in board["models"]}
    assert list(rows) == ["broken", "crash", "mlp"]  # name order
    assert rows["broken"]["status"] == "error" and "this factory is broken on purpose" in rows["broken"]["error"]
    assert "\n" not in rows["broken"]["error"]
    assert rows["crash"]["error"] == ("WorkerDied: the worker process scanning it died (killed by signal 9)")
    assert rows["broken"]["cells"] == [] == rows["crash"]["cells"]


def test_the_json_cells_are_the_lanes_the_knowledge_base_gives(scanned):
    board = json.loads((scanned[1] / "leaderboard.json").read_text())
    mlp = next(m for m in board["models"] if m["model"]["name"] == "mlp")
    cells = {c["release"]: c for c in mlp["cells"]}
    assert {r: c["lane"] for r, c in cells.items()} == {"2.0.0": "dual-track", "2.1.0": "mac-first",
                                                       "2.14.1": "mac-first"}
    (row,) = cells["2.0.0"]["blocking"]  # the one row the module docstring reasons out
    assert (row["op"], row["verdict"], row["rule"], row["verdict_source"]) == \
        ("aten::roll", "unsupported", "no-mps-kernel", "predicted")
    assert "2.0.0" in row["source"] and row["evidence"]
    assert cells["2.1.0"]["native"] and cells["2.1.0"]["blocking"] == []
    assert mlp["first_native"] == "2.1.0"
    assert all(c["source"] == "predicted" and "opscan" in c["origin"] for c in cells.values())
    assert board["counts"] == {"models": 3, "errors": 2, "cells": 3, "predicted": 3, "measured": 0}


def test_the_csv_has_a_row_per_cell_and_per_error(scanned):
    rows = list(csv.DictReader(io.StringIO((scanned[1] / "leaderboard.csv").read_text())))
    assert [(r["model"], r["release"], r["lane"]) for r in rows] == [
        ("broken", "", ""), ("crash", "", ""), ("mlp", "2.0.0", "dual-track"), ("mlp", "2.1.0", "mac-first"),
        ("mlp", "2.14.1", "mac-first")]
    old = rows[2]
    assert old["blocking_rows"] == "1" and old["blocking"] == \
        "aten::roll[float32] unsupported (no-mps-kernel)"  # the hidden activation, float32
    assert {r["first_native"] for r in rows[2:]} == {"2.1.0"} and old["cell_source"] == "predicted"


def test_the_journal_has_a_header_and_a_line_per_model(scanned):
    lines = [json.loads(x) for x in (scanned[1] / "zoo.jsonl").read_text().splitlines()]
    assert lines[0] == {"kind": "header", "journal": 1, "title": "zoo", "releases": ["2.0.0", "2.1.0", "2.14.1"]}
    assert sorted(x["result"]["model"]["name"] for x in lines[1:]) == ["broken", "crash", "mlp"]


def test_stdout_carries_only_the_requested_format(scanned, capsys, tmp_path):
    """A rerun over a finished journal scans nothing and prints the CSV it would write."""
    code, out, err = run_zoo(capsys, scanned[1].parent / "zoo.yaml", "-o", scanned[1], "--releases", RELEASES,
                             "-f", "csv")
    assert code == 1 and out == (scanned[1] / "leaderboard.csv").read_text()
    assert "3 already in" in err and "0 to scan" in err


# ---------------------------------------------------------------- resume after a kill


def test_a_rerun_scans_only_what_the_journal_lacks(tmp_path, capsys):
    """The journal of a killed run: the header, mlp's result (with a marker the scan never writes: 4242 s), and
    a torn line. The rerun must keep mlp's result as it is, drop the torn line and scan only `wide`."""
    from opscan.zoo import journal

    path = manifest(tmp_path, "models:\n" + entry("mlp", "mlp") + entry("wide", "mlp", "    args: {width: 6}\n"))
    (mlp, wide) = read_manifest(path)
    out = tmp_path / "out"
    out.mkdir()
    done = ModelResult(mlp, (), 4242.0, "Marker: from the journal").to_dict()
    (out / "zoo.jsonl").write_text(journal.line(journal.header("zoo", ("2.0.0", "2.14.1")))
                                   + journal.model_line(mlp.key, done) + '{"kind": "model", "key": "wi')
    code, _, err = run_zoo(capsys, path, "-o", out, "--releases", "2.0.0,2.14.1", "--workers", "1")
    assert "1 already in" in err and "1 to scan" in err
    lines = [json.loads(x) for x in (out / "zoo.jsonl").read_text().splitlines()]
    assert [x.get("key") for x in lines] == [None, mlp.key, wide.key]  # torn line gone, wide appended once
    board = json.loads((out / "leaderboard.json").read_text())
    kept = next(m for m in board["models"] if m["model"]["name"] == "mlp")
    assert kept["seconds"] == 4242.0 and kept["error"] == "Marker: from the journal"  # not scanned again
    assert code == 1  # the marker is an error row


def test_a_journal_for_other_releases_is_refused(tmp_path, capsys):
    from opscan.zoo import journal

    path = manifest(tmp_path, "models:\n" + entry("mlp", "mlp"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "zoo.jsonl").write_text(journal.line(journal.header("zoo", ("2.0.0",))))
    code, _, err = run_zoo(capsys, path, "-o", out, "--releases", "2.14.1")
    assert code == 2 and "was written for releases 2.0.0" in err


# ---------------------------------------------------------------- the pool's limits


def test_a_hanging_model_is_stopped_by_its_timeout():
    from opscan.zoo.pool import LocalPool

    results = []
    LocalPool(1, 3.0, ("2.14.1",)).run([ZooModel("hang", f"{TINY}:hang", fake="false")], results.append)
    (result,) = results
    assert result["error"] == "Timeout: no result after 3 s (--timeout)" and result["seconds"] >= 3.0


# ---------------------------------------------------------------- diff and merge (crafted boards)


def _cell(release: str, lane: str, *ops: str, source: str = "predicted") -> Cell:
    rows = tuple(BlockingRow(op, ("float32",), "unsupported", "no-mps-kernel", f"{op} has no MPS kernel",
                             f"native_functions.yaml (torch {release} wheel)", source) for op in ops)
    why = ("all rows are native",) if not ops else (f"{ops[0]} is unsupported",)
    return Cell(ReleaseResult(release, lane, why, not ops, rows, 10), source, "crafted")


def _board(*models: ModelResult, releases=("2.0.0", "2.14.1")) -> Leaderboard:
    return Leaderboard("crafted", releases, models, "0.1.0", "2026-12-01T00:00:00Z")


def _model(name: str, *cells: Cell, error: str | None = None) -> ModelResult:
    return ModelResult(ZooModel(name, f"{TINY}:mlp"), cells, 1.0, error)


OLD = _board(_model("a", _cell("2.0.0", "linux-gpu-first", "aten::lerp_.Scalar"), _cell("2.14.1", "mac-first")),
             _model("b", _cell("2.0.0", "mac-first"), _cell("2.14.1", "mac-first")),
             _model("gone", _cell("2.0.0", "mac-first")))
NEW = _board(_model("a", _cell("2.0.0", "mac-first"), _cell("2.14.1", "mac-first")),
             _model("b", _cell("2.0.0", "mac-first"), _cell("2.14.1", "dual-track", "aten::take")),
             _model("c", error="TargetError: x"))


def test_diff_lists_lane_changes_with_the_rows_behind_them(tmp_path, capsys):
    from opscan.zoo.outputs import render_json

    (tmp_path / "old.json").write_text(render_json(OLD))
    (tmp_path / "new.json").write_text(render_json(NEW))
    code, out, _ = run_zoo(capsys, "diff", tmp_path / "old.json", tmp_path / "new.json")
    assert code == 1
    assert out.splitlines() == [
        "2 lane changes, 1 models added, 1 removed",
        "a @ 2.0.0: linux-gpu-first -> mac-first",
        "  - aten::lerp_.Scalar[float32] unsupported (no-mps-kernel)",
        "b @ 2.14.1: mac-first -> dual-track",
        "  + aten::take[float32] unsupported (no-mps-kernel)",
        "added: c", "removed: gone"]
    code, out, _ = run_zoo(capsys, "diff", tmp_path / "old.json", tmp_path / "old.json", "-f", "json")
    assert code == 0 and json.loads(out) == {"changes": [], "added": [], "removed": []}


def test_diff_refuses_a_file_that_is_not_a_leaderboard(tmp_path, capsys):
    (tmp_path / "r.json").write_text('{"schema": "opscan-report/3"}')
    code, _, err = run_zoo(capsys, "diff", tmp_path / "r.json", tmp_path / "r.json")
    assert code == 2 and "is not an opscan zoo leaderboard (schema 'opscan-report/3'" in err


def test_diff_refuses_a_leaderboard_whose_releases_are_not_releases(tmp_path, capsys):
    from opscan.zoo.outputs import render_json

    data = json.loads(render_json(OLD))
    (tmp_path / "bad.json").write_text(json.dumps({**data, "releases": ["2.0.0", "nightly"]}))
    code, _, err = run_zoo(capsys, "diff", tmp_path / "bad.json", tmp_path / "bad.json")
    assert code == 2 and "'nightly' in its releases is not a torch release" in err


def test_measured_cells_replace_predicted_ones_and_are_counted():
    from opscan.zoo.board import merge_measured

    mac = _cell("2.14.1", "dual-track", "aten::take", source="measured")
    merged = merge_measured(OLD, {("b", "2.14.1"): mac, ("b", "2.15.0"): _cell("2.15.0", "mac-first")})
    b = next(m for m in merged.models if m.model.name == "b")
    assert b.cell("2.14.1") == mac and b.cell("2.0.0") == OLD.models[1].cell("2.0.0")
    assert merged.releases == ("2.0.0", "2.14.1", "2.15.0")
    assert merged.counts()["measured"] == 1 and merged.counts()["cells"] == 6  # 2 + 3 (b) + 1
    assert Leaderboard.from_dict(merged.to_dict()).to_dict() == merged.to_dict()  # the JSON round-trips


# ---------------------------------------------------------------- HTML, in a browser


def test_the_html_is_self_contained_and_marks_each_cell(tmp_path):
    from opscan.zoo.html import render_html

    page = render_html(OLD)
    assert "<script src" not in page and "<link" not in page and "url(" not in page
    assert page.count('<td class="cell lane-') == 5  # a: 2, b: 2, gone: 1 (its 2.14.1 is "-")
    assert 'data-key="a@2.0.0" data-sort="2" data-source="predicted"' in page and "gpu<sup>P</sup>" in page


def test_the_html_runs_in_chromium_sorts_and_opens_a_cell(tmp_path):
    from test_html import chromium

    from opscan.zoo.html import render_html

    path = tmp_path / "board.html"
    path.write_text(render_html(OLD), encoding="utf-8")
    dom = chromium(tmp_path, "--dump-dom", path.as_uri() + "#open=a@2.0.0").stdout
    assert 'data-ready="true"' in dom and 'data-js-errors="' not in dom
    assert 'data-shown="a@2.0.0"' in dom and "<td>aten::lerp_.Scalar</td>" in dom
    assert "native_functions.yaml (torch 2.0.0 wheel)" in dom and "linux-gpu-first (predicted)" in dom
    dom = chromium(tmp_path, "--dump-dom", path.as_uri() + "#sort=4").stdout  # column 4: release 2.0.0
    order = [line.split('"')[1] for line in dom.split('<tr data-model=')[1:]]
    assert order == ["b", "gone", "a"]  # by lane rank: mac-first (b, gone: name order kept), then linux-gpu-first


# ---------------------------------------------------------------- Ray


def test_the_ray_path_gives_the_pools_rows(tmp_path, capsys, scanned):
    import ray  # the dev extra installs it: CI runs this test, never skips it
    path = manifest(tmp_path, "models:\n" + entry("mlp", "mlp") + entry("broken", "broken") + entry("crash", "crash")
                    + entry("other", "mlp"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        code, _, err = run_zoo(capsys, path, "-o", tmp_path / "out", "--releases", RELEASES, "--ray", "auto",
                               "--match", "[mbc]*")  # not `other`
    finally:
        ray.shutdown()
    assert code == 1, err
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    pool = json.loads((scanned[1] / "leaderboard.json").read_text())

    def lanes(b, name):
        m = next(m for m in b["models"] if m["model"]["name"] == name)
        return m["error"], [(c["release"], c["lane"], [r["op"] for r in c["blocking"]]) for c in m["cells"]]

    assert lanes(board, "mlp") == lanes(pool, "mlp")
    assert lanes(board, "broken") == lanes(pool, "broken")
    assert [m["model"]["name"] for m in board["models"]] == ["broken", "crash", "mlp"]
    crash = lanes(board, "crash")[0]  # the task's worker died: a lost task is that model's error row
    assert crash.startswith("RayTaskLost: "), crash


def test_help_lists_the_zoo_without_importing_torch():
    code = ("import sys; from opscan.cli import main; main(['zoo', '--help']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and "MANIFEST|FAMILY" in done.stdout, done.stderr


def test_the_browser_check_catches_a_broken_zoo_page(tmp_path):
    """The negative control for the check above: a script error is recorded on <body>."""
    from test_html import chromium

    from opscan.zoo.html import render_html

    path = tmp_path / "board.html"
    path.write_text(render_html(OLD).replace("<script>\n(function", "<script>\nnoSuchFunction();(function"),
                    encoding="utf-8")
    assert "noSuchFunction();(function" in path.read_text()
    dom = chromium(tmp_path, "--dump-dom", path.as_uri()).stdout
    assert 'data-ready="true"' not in dom


# ---------------------------------------------------------------- families and their factories


def test_the_torchvision_family_is_every_non_quantized_model_once():
    import torchvision.models as tvm

    from opscan.zoo.families import family

    models = family("torchvision")
    # list_models per module in torchvision 0.29.1: 80 classification, 12 detection, 6 segmentation, 9 video,
    # 2 optical flow = 109 (the 12 quantized ones are left out)
    expected = sum(len(tvm.list_models(module=m)) for m in (tvm, tvm.detection, tvm.segmentation, tvm.video,
                                                            tvm.optical_flow))
    assert len(models) == expected == len({m.name for m in models})
    by_name = {m.name: m for m in models}
    assert by_name["raft_small"].args == {"name": "raft_small", "kind": "optical_flow"}
    assert by_name["ssd300_vgg16"].fake == "false" and by_name["resnet18"].fake == "auto"


def test_trunc_normal_works_on_fake_tensors_inside_the_factories():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opscan.zoo.factories import fake_safe_init

    with FakeTensorMode():
        weight = torch.empty(4, 4)
        with pytest.raises(Exception):  # torch 2.14.1: rejection sampling asks mask.any() of a fake tensor
            torch.nn.init.trunc_normal_(weight, std=0.02)
        with fake_safe_init():
            assert torch.nn.init.trunc_normal_(weight, std=0.02).shape == (4, 4)
    real = torch.empty(1000)
    with fake_safe_init():
        torch.nn.init.trunc_normal_(real, std=1.0, a=-0.5, b=0.5)  # real tensors keep the real sampler
    assert real.abs().max() <= 0.5


@pytest.mark.slow
def test_a_full_size_convnext_is_traced_with_fake_tensors():
    """torchvision's convnext_tiny at full size (28M parameters) through the zoo's task, for 2.14.1: built and
    traced with fake tensors (no fallback to real ones), all native there (tests/test_predict_models.py pins
    ConvNeXt's rows native)."""
    from opscan.zoo.families import family
    from opscan.zoo.task import run_model

    model = next(m for m in family("torchvision") if m.name == "convnext_tiny")
    result = run_model(model.to_dict(), ("2.14.1",))
    assert result["error"] is None and result["fake"] is True
    (cell,) = result["cells"]
    assert cell["native"] and cell["lane"] == "mac-first"


@pytest.mark.parametrize("args", [(0.1, 12), (0.0, 12), (0.3, 1), (0.2, [2, 2, 6, 2]), (0.2, [2, 2, 6, 2], True)])
def test_the_python_drop_path_schedule_is_timms(args):
    """The zoo builds timm models under fake tensors with a plain-Python drop-path schedule: it must give timm's
    own values (torch.linspace(0, rate, n), split per stage when stagewise)."""
    from timm.layers import calculate_drop_path_rates

    from opscan.zoo.factories import _drop_path_rates

    theirs, ours = calculate_drop_path_rates(*args), _drop_path_rates(*args)

    def flat(rates):
        return [v for s in rates for v in (s if isinstance(s, list) else [s])]

    assert [type(s) for s in ours] == [type(s) for s in theirs]  # a list per stage when stagewise
    assert flat(ours) == pytest.approx(flat(theirs), abs=1e-6)
