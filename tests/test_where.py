"""Each row's `where` (issue 29): the line of the user's own code that made its calls — the innermost frame outside
opscan, torch, the standard library and installed libraries — with the installed library's own line below it as
`via`; a backward call's is the forward call that created its autograd node; a call no line of the user's code
made (opscan's default step running a library model, its default loss, its optimizer) gets the target's factory.

Pinned on every finding row of examples/tricky.py, on a transformers model (examples/hf_bert.py, predicted for
torch 2.0.0, where its mask's bool `&` has no MPS kernel), a timm model with the default step and the same timm model
under a `train_step` of the user's own (tests/targets/where_zoo.py, where_step.py; predicted for 2.5.0, whose MPS
convolution backward is a known silent bug, and 2.0.0, whose bool `~` in the label-smoothed loss is unsupported).
Line numbers are found by searching the targets' source text, so an edit there moves them with it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import opscan
from opscan.cli import main as opscan_main
from opscan.scan import ScanOptions, scan

REPO = Path(__file__).resolve().parents[1]
TRICKY = REPO / "examples" / "tricky.py"
BERT = REPO / "examples" / "hf_bert.py"
ZOO = REPO / "tests" / "targets" / "where_zoo.py"
STEP = REPO / "tests" / "targets" / "where_step.py"
CUSTOM = REPO / "examples" / "custom_step.py"


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the one line of `path` that contains `text`."""
    found = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if text in line]
    assert len(found) == 1, (path.name, text, found)
    return found[0]


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _scan(path: Path, function: str, **options):
    return scan(ScanOptions(f"{path}:{function}", memory=False, **options))


def places(report, op: str, dtypes=None) -> list[list[dict]]:
    """The `where` of every row of `op` (with these dtypes), as the report JSON has it."""
    rows = [r for r in report.to_dict()["ops"] if f"{r['op']}.{r['overload']}".removesuffix(".default") == op
            and (dtypes is None or r["dtypes"] == list(dtypes))]
    assert rows, op
    return [r["where"] for r in rows]


def at(where: list[dict]) -> list[tuple]:
    return [(p["file"], p["line"], p["function"], p["by"], tuple(p["phases"])) for p in where]


def library_line(via: dict) -> str:
    """The source line a `via` names, read from the installed library."""
    import site

    for folder in site.getsitepackages():
        path = Path(folder) / via["file"]
        if path.is_file():
            return path.read_text(encoding="utf-8").splitlines()[via["line"] - 1]
    raise AssertionError(via)


@pytest.fixture(scope="module")
def tricky():
    return _scan(TRICKY, "build_model")


def test_every_finding_row_of_tricky_names_its_line_in_forward(tricky):
    line = {key: line_of(TRICKY, text) for key, text in {
        "embed": "text = self.embed(tokens).mean(dim=1)", "pool": "feats = self.pool(self.conv(image))",
        "take": "picked = torch.take(feats, self.picks)", "scale": "out = scale(out, 0.5)",
        "double": "precise = out.double() + self.offsets", "float": "return precise.float()"}.items()}
    fwd, bwd = ("forward",), ("backward",)
    f = rel(TRICKY)
    expected = {
        ("aten::embedding_renorm_", None): [(f, line["embed"], "Tricky.forward", "call", fwd)],
        ("aten::_adaptive_avg_pool2d", None): [(f, line["pool"], "Tricky.forward", "call", fwd)],
        ("aten::_adaptive_avg_pool2d_backward", None): [(f, line["pool"], "Tricky.forward", "call", bwd)],
        ("aten::take", None): [(f, line["take"], "Tricky.forward", "call", fwd)],
        ("aten::put_", None): [(f, line["take"], "Tricky.forward", "call", bwd)],  # take's backward
        ("tricky::scale", None): [(f, line["scale"], "Tricky.forward", "call", fwd)],
        ("aten::add.Tensor", ("float64", "float64")): [(f, line["double"], "Tricky.forward", "call", fwd)],
        # .double() copies to float64 in forward; its backward copies the gradient back: the .float() line's node
        # runs double's backward direction and the reverse
        ("aten::copy_", ("float64", "float32")): [(f, line["double"], "Tricky.forward", "call", fwd),
                                                  (f, line["float"], "Tricky.forward", "call", bwd)],
        ("aten::copy_", ("float32", "float64")): [(f, line["float"], "Tricky.forward", "call", fwd),
                                                  (f, line["double"], "Tricky.forward", "call", bwd)],
    }
    # every finding row is one of these (and each of these a finding row)
    assert sorted((r.op.display, r.dtypes if (r.op.display, r.dtypes) in expected else None)
                  for r in tricky.finding_rows) == sorted(expected, key=lambda k: (k[0], k[1] or ()))
    for (op, dtypes), want in expected.items():
        assert [at(w) for w in places(tricky, op, dtypes)] == [want], op
        assert all(p["via"] is None for w in places(tricky, op, dtypes) for p in w)  # tricky calls torch itself


def test_the_default_steps_own_calls_get_the_factory_line(tricky):
    factory = (rel(TRICKY), line_of(TRICKY, "def build_model("), "build_model", "factory")
    # the default loss (the sum of the output, opscan's code) and AdamW's step (run by opscan's default step)
    for op, phase in (("aten::sum.dim_IntList", "loss"), ("aten::fill_.Scalar", "loss"),
                      ("aten::addcdiv_", "optimizer")):
        made = [at([p])[0] for w in places(tricky, op) for p in w if phase in p["phases"]]
        assert made == [(*factory, (phase,))], (op, made)


@pytest.mark.parametrize("path, function, version, op, dtypes", [
    (BERT, "build_model", "2.0.0", "aten::bitwise_and.Tensor", ("bool", "bool")),
    (ZOO, "timm_model", "2.5.0", "aten::mps_convolution_backward", None),
])
def test_a_library_model_under_the_default_step_gets_the_factory_and_the_librarys_line(path, function, version, op,
                                                                                       dtypes):
    report = _scan(path, function, torch_version=version)
    assert report.finding_rows
    factory = (rel(path), line_of(path, f"def {function}("), function, "factory")
    for row in report.finding_rows:  # every finding row: the factory's line, through the library's own
        assert row.where and all(at([p])[0][:4] == factory and p["via"] for p in row.where), row.op.display
    (where,) = places(report, op, dtypes)
    for place in where:
        source = library_line(place["via"])
        if path == BERT:  # transformers' mask: `result & mask(...)`
            assert place["via"]["file"].startswith("transformers/") and " & " in source, source
        else:  # a timm block calling its conv module: `x = self.conv_dw(x)`, `x = self.fc1(x)`, `x = self.stem(x)`
            assert place["via"]["file"].startswith("timm/") and re.search(r"x = self\.\w+\(x\)", source), source
            assert place["phases"] == ["backward"]


@pytest.fixture(scope="module")
def stepped():
    return {version: _scan(STEP, "build_model", torch_version=version) for version in ("2.0.0", "2.5.0")}


def test_a_train_step_of_the_users_own_names_its_lines(stepped):
    logits, loss = line_of(STEP, "logits = model(inputs)"), line_of(STEP, "loss = F.cross_entropy(")
    f = rel(STEP)
    old, new = stepped["2.0.0"], stepped["2.5.0"]
    # 2.0.0: the label-smoothed loss's bool `~` has no MPS kernel: the loss line, torch called directly
    (finding,) = old.finding_rows
    assert finding.op.display == "aten::bitwise_not" and at(finding.where) == [(f, loss, "train_step", "call",
                                                                                 ("loss",))]
    assert finding.where[0]["via"] is None
    # 2.5.0: convolution backward (a known silent bug): the forward call that made each node, through timm's lines
    (finding,) = new.finding_rows
    assert finding.op.display == "aten::mps_convolution_backward" and len(finding.where) > 1
    for place in finding.where:
        assert at([place]) == [(f, logits, "train_step", "call", ("backward",))]
        assert place["via"]["file"].startswith("timm/")
    for report in (old, new):
        for row in report.rows:  # every row of the step: one of the step's own lines, never opscan's or pytest's
            assert row.where and {p["file"] for p in row.where} == {f}, row.op.display
            if row.phases == ("optimizer",):
                assert {p["line"] for p in row.where} == {line_of(STEP, "optimizer.step()")}
            assert {p["line"] for p in row.where} <= {logits, loss, line_of(STEP, "loss.backward()"),
                                                      line_of(STEP, "optimizer.step()")}


def test_custom_steps_autocast_gate_names_the_with_line():
    report = _scan(CUSTOM, "build_model", torch_version="2.0.0")
    (finding,) = report.finding_rows
    assert finding.op.display == "torch::autocast.mps"
    assert at(finding.where) == [(rel(CUSTOM), line_of(CUSTOM, "with torch.autocast("), "train_step", "call",
                                  ("loss",))]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return torch.take(self.fc(x), torch.tensor([0, 3]))  # the line the API's report names


def test_analyze_names_lines_relative_to_the_project_and_never_the_callers():
    report = opscan.analyze(_Net(), torch.randn(2, 4), memory=False)
    here = Path(__file__)
    (take,) = places(report, "aten::take")
    assert at(take) == [(rel(here), line_of(here, "# the line the API" + "'s report names"), "_Net.forward", "call",
                         ("forward",))]
    # no factory in memory: the default loss and AdamW, run by opscan, have no line of the user's; the frames that
    # called opscan.analyze (this test, pytest) are no part of the step
    assert places(report, "aten::addcdiv_") == [[]]
    assert all(p["file"] == rel(here) for row in report.to_dict()["ops"] for p in row["where"])


def test_the_table_and_the_html_show_the_line(tricky):
    from opscan.render.console import render_table
    from opscan.render.html import render_html

    take = line_of(TRICKY, "picked = torch.take(feats, self.picks)")
    table = render_table(tricky, width=160).splitlines()
    # the findings table: one row per cause, its where column the user's path:line; take and its backward's put_
    # are one cause (one line, one rule)
    row = next(line for line in table if f"examples/tricky.py:{take} " in line and line[:1].isdigit())
    assert row.split()[1:4] == ["unsupported", f"examples/tricky.py:{take}", "aten::take,"]
    entry = table.index(next(line for line in table if line.startswith("[") and f"tricky.py:{take} in" in line))
    assert table[entry:entry + 3] == [
        f"[2] examples/tricky.py:{take} in Tricky.forward: unsupported (predicted)",
        "      picked = torch.take(feats, self.picks)",
        "    ops: aten::take [float32,int64] (forward, 1 call); aten::put_ [float32,int64,float32] (backward, 1 "
        "call)"]
    copy = line_of(TRICKY, "return precise.float()")  # a row made at two lines is in both lines' findings
    assert f"[4] examples/tricky.py:{copy} in Tricky.forward: unsupported_dtype (predicted)" in table
    verbose = render_table(tricky, width=160, verbose=True)
    assert f"tricky.py:{copy} (+1)" in verbose  # -v: every row, its first line and how many more
    page = render_html(tricky)
    assert f"<code>examples/tricky.py:{take} in Tricky.forward</code>" in page
    assert '<pre class="source"><code>picked = torch.take(feats, self.picks)</code></pre>' in page
    assert f"<td>tricky.py:{take}</td>" in page and "<th>where</th>" in page


def test_issue_md_says_where_it_was_called_from_without_absolute_paths(tmp_path):
    from opscan.repro.cause_text import called_from

    here = os.getcwd()
    os.chdir(tmp_path)  # not the project: relative names come from the target's project, not the working folder
    try:
        assert opscan_main([f"{TRICKY}:build_model", "--no-probe", "--repro", "--no-memory", "-o", "out", "-q",
                            "-f", "json"]) == 0
        # take is for PyTorch's missing-ops tracker, so --repro drafted no ISSUE.md: --draft writes it anyway
        assert opscan_main(["repro", "out/report.json", "aten::take", "--draft"]) == 0
    finally:
        os.chdir(here)
    issue = (tmp_path / "out" / "repro" / "aten_take" / "ISSUE.md").read_text(encoding="utf-8")
    take = line_of(TRICKY, "picked = torch.take(feats, self.picks)")
    assert f"Called from (the scanned code's lines that made these calls):\n\n- `examples/tricky.py:{take}` in " \
           "`Tricky.forward`: `picked = torch.take(feats, self.picks)`\n" in issue
    assert str(REPO) not in issue
    # a file outside the project keeps its name only; a factory and a library's line are said as such
    report = {"ops": [{"where": [
        {"file": "/srv/other/model.py", "line": 3, "function": "Net.forward", "by": "call", "phases": ["forward"],
         "calls": 1, "via": None},
        {"file": "train.py", "line": 9, "function": "build", "by": "factory", "phases": ["forward", "backward"],
         "calls": 2, "via": {"file": "timm/layers/mlp.py", "line": 48, "function": "Mlp.forward"}}]}]}
    assert called_from(report, [{"row": 0}]).splitlines()[2:] == [
        "- `model.py:3` in `Net.forward` (forward)",
        "- `train.py:9` in `build`, the target's factory: opscan's default step ran its model · via "
        "`timm/layers/mlp.py:48` in `Mlp.forward` (forward, backward)"]
    assert called_from(report, [{"row": 5}]) == ""
    # an edited report (`opscan repro` reads one opscan may not have written): what is not a place is left out
    for ops in ("x", [7], [{"where": "x"}], [{"where": [3, {"file": 5}, {"file": "a.py", "via": "x"}]}]):
        assert called_from({"ops": ops}, [{"row": 0}]) == ""
