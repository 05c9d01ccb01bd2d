"""Findings, one per cause (issue 35): the user's line and the rule, with the rows made there listed under it and one
fix (report/findings.py); where each belongs upstream (report/upstream.py); every view speaking in causes — the table
at any width with every `path:line`, JSON, SARIF, GitHub annotations, ISSUE.md only for causes worth filing.

Hand-built rows (no torch) for the grouping and the upstream rules; a real step (tests/targets/one_cause.py) measured
on the SIMULATED MPS backend for "one bad line, many ops: one finding, one annotation, one ISSUE.md"; tricky through
the real command line for the widths, colours and files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import torch

from opscan.cli import main as opscan_main
from opscan.render import render_github, render_sarif, render_table
from opscan.report.findings import build_findings
from opscan.report.upstream import user_code_rule, upstream_of
from opscan.report.where import at_text
from opscan.verdict import Verdict

from helpers_report import place, report, row

REPO = Path(__file__).resolve().parents[1]
TRICKY = f"{REPO / 'examples' / 'tricky.py'}:build_model"
ONE_CAUSE = REPO / "tests" / "targets" / "one_cause.py"
F64 = "dtype-float64"


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# --- grouping ----------------------------------------------------------------------------------------------------


def float64_rows():
    """`x.double() + b` at line 7 makes a copy and an add; `.float()` at line 8 copies back, and line 7's copy's
    backward is made at line 7 too (a backward call's line is its forward's)."""
    at7 = place(7, "y = x.double() + self.b", phases=("forward", "backward"), calls=2)
    return (
        row("aten::copy_", ["float64", "float32"], Verdict.UNSUPPORTED_DTYPE, ["m"], calls=3, rule=F64,
            remedy="cast to float32", where=[at7, place(8, "return y.float()", phases=("backward",))]),
        row("aten::add.Tensor", ["float64", "float64"], Verdict.UNSUPPORTED_DTYPE, ["m"], rule=F64,
            remedy="cast to float32", where=[place(7, "y = x.double() + self.b")]),
        row("aten::relu", ["float32"], Verdict.NATIVE, ["m"], where=[place(7, "y = x.double() + self.b")]),
    )


def test_one_line_and_rule_is_one_finding_with_its_rows_listed_under_it():
    rows = float64_rows()
    at7, at8 = build_findings(rows)
    assert (at7.site["line"], at7.rule, at7.ops, at7.calls) == (7, F64, ("aten::copy_", "aten::add.Tensor"), 3)
    assert [(p.row, p.calls, p.phases) for p in at7.parts] == [(0, 2, ("forward", "backward")), (1, 1, ("forward",))]
    assert at7.site["text"] == "y = x.double() + self.b" and at7.fix == "cast to float32"
    assert at7.phases == ("forward", "backward") and at7.upstream.kind == "documented"
    # the copy made at two lines is in both findings, each with the calls made there
    assert (at8.site["line"], at8.ops, at8.calls) == (8, ("aten::copy_",), 1)


def test_the_same_line_under_two_rules_is_two_findings_most_severe_first():
    rows = (*float64_rows()[:2],
            row("aten::take", ["float32", "int64"], Verdict.ERROR, ["m"], rule="kernel-x",
                where=[place(7, "y = x.double() + self.b")]))
    found = build_findings(rows)
    assert [(f.site["line"], f.rule, f.verdict) for f in found] == [
        (7, "kernel-x", Verdict.ERROR), (7, F64, Verdict.UNSUPPORTED_DTYPE), (8, F64, Verdict.UNSUPPORTED_DTYPE)]


def test_a_row_naming_its_causes_is_found_at_them_and_is_the_users_bug():
    # issue 33's placement finding: a CPU tensor made at line 3 meets MPS kernels at lines 20 and 25; its cause
    # sites (shaped like `where` entries) override the lines of the calls, and its rule is the user's code
    made = {"file": "model.py", "line": 3, "function": "<module>", "text": "TARGETS = torch.tensor([1, 0])"}
    host = replace(row("aten::nll_loss_forward", ["float32", "int64"], Verdict.ERROR, [""], calls=2,
                       rule="placement-host-tensor", where=[place(20, "loss = F.nll_loss(out, TARGETS)"),
                                                            place(25, "aux = F.nll_loss(o2, TARGETS)")]),
                   causes=(made,))
    (finding,) = build_findings((host,))
    assert (finding.site["line"], finding.site["text"], finding.calls) == (3, made["text"], 2)
    assert finding.upstream.kind == "user-code" and not finding.upstream.issue
    assert user_code_rule("placement-host-tensor") and user_code_rule("device-cuda-call")
    assert not user_code_rule("placementish") and not user_code_rule("no-mps-kernel")
    assert host.to_dict()["causes"] == [made]


def test_a_findings_key_survives_lines_moving():
    rows = float64_rows()
    moved = tuple(replace(r, where=tuple({**p, "line": p["line"] + 40} for p in r.where)) for r in rows)
    assert [f.key for f in build_findings(rows)] == [f.key for f in build_findings(moved)]


# --- where each belongs upstream ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kind, words", [
    (("dtype-float64", "unsupported_dtype", ["aten::copy_"]), "documented", "documented limitation"),
    (("probe-dtype", "unsupported_dtype", ["aten::mul.Tensor"], None, (), (), (), ["float64"]), "documented",
     "64-bit"),
    (("target-registration-composite", "unknown", ["tricky::scale"]), "custom-op", "scanned code's own operator"),
    (("torchvision-mps-later", "unsupported", ["torchvision::roi_align"]), "custom-op", "torchvision's operator"),
    (("shape-adaptive", "error", ["aten::_adaptive_avg_pool2d"], None,
      ["users: pytorch/pytorch #97109, #143864; added by pytorch/pytorch PR #85726"]), "known",
     "pytorch/pytorch#97109, pytorch/pytorch#143864 —"),
    (("silent-bug-7", "mismatch", ["aten::linear"], None, (), [161640]), "known", "pytorch/pytorch#161640"),
    (("no-mps-kernel", "unsupported", ["aten::take"]), "tracker", "pytorch/pytorch#141287"),
    (("always-cpu", "cpu_fallback", ["aten::embedding_renorm_"]), "tracker", "by design"),
    (("dtype-release", "unsupported_dtype", ["aten::add.Tensor"], "2.3.0"), "fixed", "native from torch 2.3.0"),
    (("not-in-yaml", "unknown", ["aten::foo"]), "check", "measure it on a Mac"),
    (("lstm-projections", "error", ["aten::_lstm_mps"]), "report", "drafts an ISSUE.md"),
    (("probe-mismatch", "mismatch", ["aten::sinh"]), "report", "drafts an ISSUE.md"),
    (("probe-error", "error", ["aten::nll_loss_forward"], None, (), (), ["placement-host-tensor"]), "user-code",
     "bug in the scanned code"),
])
def test_where_a_finding_belongs_upstream(args, kind, words):
    found = upstream_of(*args)
    assert found.kind == kind and words in found.text, found
    assert found.issue == (kind == "report")
    if kind == "known":
        assert all(u.startswith("https://github.com/pytorch/pytorch/issues/") for u in found.links)
        assert "85726" not in found.text  # a pull request is no issue


# --- the views ---------------------------------------------------------------------------------------------------


def plain(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_the_table_shows_every_findings_path_and_line_at_any_width(width):
    r = report()
    lines = plain(render_table(r, width=width, color=False))
    assert all(len(line) <= width for line in lines)
    at = lines.index(next(line for line in lines if line.startswith("Findings:")))
    table = lines[at + 1:lines.index("Why, and what to do:")]
    for finding in r.findings:
        if finding.site:
            assert any(at_text(finding.site) in line for line in table), (width, at_text(finding.site))


def test_a_narrow_table_puts_the_line_on_a_sub_line_of_its_own(golden):
    text = "\n".join(plain(render_table(report(), width=60, color=False)))
    golden("table-width60.txt", text + "\n")
    lines = text.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("1  unsupported_dtype")))
    assert lines[first + 1].strip() == "model.py:18"  # its own sub-line, under the row


def test_the_report_repr_is_one_line():
    text = repr(report())
    assert "\n" not in text and len(text) < 200
    assert text == ("<Report model.py:build_model: predicted for torch 2.14.1, lane dual-track, 4 findings (3 of 5 "
                    "rows not native)>")


def test_the_json_lists_the_findings_and_keeps_the_rows():
    schema = json.loads(resources.files("opscan").joinpath("schema/report-v4.json").read_text(encoding="utf-8"))
    data = report(rows=(*report().rows, *float64_rows())).to_dict()
    jsonschema.Draft202012Validator(schema).validate(data)
    assert data["schema_version"] == 4
    assert len(data["ops"]) == 8 and len(data["findings"]) == 6
    first = next(f for f in data["findings"] if f["rule"] == F64 and f["site"]["line"] == 7)
    assert [data["ops"][p["row"]]["op"] for p in first["parts"]] == ["aten::copy_", "aten::add"]
    assert first["upstream"] == {"kind": "documented", "issue": False, "links": [],
                                 "text": first["upstream"]["text"]}


def test_sarif_and_github_speak_in_causes():
    r = report(rows=float64_rows())
    results = json.loads(render_sarif(r))["runs"][0]["results"]
    assert len(results) == 2 == len(r.findings)
    region = results[0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 7, "snippet": {"text": "y = x.double() + self.b"}}
    assert results[0]["partialFingerprints"] == {"opscanFinding/v1": r.findings[0].key}
    assert results[0]["properties"]["ops"] == ["aten::copy_", "aten::add.Tensor"]
    annotations = render_github(r).splitlines()
    assert len(annotations) == 2 and annotations[0].startswith("::error file=model.py,line=7,")
    assert "documented limitation" in annotations[0]


# --- a real step: one bad line, many ops ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_cause():
    """tests/targets/one_cause.py measured on the SIMULATED MPS backend, which gets sinh and cosh wrong."""
    import simulated_mps
    from opscan.probe.stage import ProbeOptions
    from opscan.scan import ScanOptions, scan

    double = simulated_mps.double({"ops": {"aten::sinh": "wrong", "aten::cosh": "wrong"}})
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
        return scan(ScanOptions(f"{ONE_CAUSE}:build_model", memory=False, repro=True,
                                probe=ProbeOptions(device="mps", workers=1, double=double)))


def test_one_bad_line_with_many_ops_is_one_finding_one_annotation_one_issue(one_cause):
    from opscan.repro import render_files

    bad, cast = line_of(ONE_CAUSE, "the one bad line"), line_of(ONE_CAUSE, "float64: documented")
    at_bad = [f for f in one_cause.findings if f.site and f.site["line"] == bad]
    (finding,) = at_bad
    assert set(finding.ops) == {"aten::sinh", "aten::cosh"} and finding.calls == 4
    assert finding.phases == ("forward", "backward") and finding.upstream.kind == "report"
    rows = [r for r in one_cause.rows if r.verdict == Verdict.MISMATCH]
    assert len(rows) == 2  # two rows, four calls, one cause
    annotations = [a for a in render_github(one_cause).splitlines() if f",line={bad}," in a]
    assert len(annotations) == 1 and "aten::sinh [float32], aten::cosh [float32]" in annotations[0]
    files = render_files(one_cause.to_dict())
    issues = {k: v for k, v in files.items() if k.endswith("ISSUE.md")}
    (issue,) = [text for text in issues.values() if f"one_cause.py:{bad}`" in text]
    assert "also makes `aten::cosh`" in issue and "../aten_cosh/repro_1.py" in issue
    # the float64 line is a finding, but a documented limitation: no ISSUE.md speaks of it
    assert any(f.site and f.site["line"] == cast and f.upstream.kind == "documented" for f in one_cause.findings)
    assert not any(f"one_cause.py:{cast}`" in text for text in issues.values())
    assert {k for k in files if "aten_copy_" in k} == {"repro/aten_copy_/repro_1.py", "repro/aten_copy_/repro_2.py",
                                                      "repro/aten_copy_/repro_3.py"}  # scripts, no ISSUE.md


# --- the command line ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tricky_out(tmp_path_factory):
    """`opscan TRICKY --repro -o DIR` through the real command line, stdout piped, COLUMNS=80: (stdout, DIR)."""
    out = tmp_path_factory.mktemp("tricky")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    done = subprocess.run([sys.executable, "-m", "opscan", TRICKY, "--repro", "--no-memory", "-o", str(out)],
                          env={**env, "COLUMNS": "80"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, out


def test_piped_output_keeps_columns_and_shows_every_path_and_line(tricky_out):
    stdout, out = tricky_out
    lines = stdout.splitlines()
    assert lines and all(len(line.rstrip()) <= 80 for line in lines)
    assert "\x1b[" not in stdout
    data = json.loads((out / "report.json").read_text())
    sites = [f"{f['site']['file']}:{f['site']['line']}" for f in data["findings"]]
    assert len(sites) == 6 and all(site.startswith("examples/tricky.py:") for site in sites)
    table = stdout[stdout.index("Findings:"):stdout.index("Why, and what to do:")]
    assert all(site in table for site in sites)


def test_no_issue_md_for_float64_a_custom_op_or_a_known_issue(tricky_out):
    _, out = tricky_out
    issues = sorted(p.relative_to(out).as_posix() for p in (out / "repro").glob("*/ISSUE.md"))
    # tricky's causes: float64 (documented), tricky::scale (its own op), adaptive pooling (known issues), take and
    # embedding_renorm_ (the missing-ops tracker): scripts for every call, nothing drafted for PyTorch
    assert issues == []
    assert sorted(p.name for p in (out / "repro" / "aten_copy_").iterdir()) == ["repro_1.py", "repro_2.py",
                                                                                 "repro_3.py"]
    # a draft's Versions, off a Mac: the release the verdicts were predicted for, never this machine's own build
    from opscan.repro import render_files

    data = json.loads((out / "report.json").read_text())
    versions = render_files(data, every_finding=True)["repro/aten_take/ISSUE.md"].split("### Versions")[1]
    assert f"- torch: predicted for torch `{data['assumptions']['torch_release']}`:" in versions
    assert data["environment"]["torch"] not in versions


def test_force_color_colours_piped_output(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert opscan_main([f"{REPO / 'tests' / 'targets' / 'tiny.py'}:build_model", "--no-memory", "-q",
                        "-o", str(tmp_path)]) == 0
    coloured = capsys.readouterr().out
    monkeypatch.delenv("FORCE_COLOR")
    assert opscan_main([f"{REPO / 'tests' / 'targets' / 'tiny.py'}:build_model", "--no-memory", "-q",
                        "-o", str(tmp_path)]) == 0
    assert "\x1b[" in coloured and "\x1b[" not in capsys.readouterr().out


@pytest.mark.parametrize("typed, meant", [("covrage", "coverage"), ("reporo", "repro"), ("acept", "accept"),
                                          ("bundel", "bundle")])
def test_a_mistyped_subcommand_suggests_the_right_one(capsys, typed, meant):
    assert opscan_main([typed, "x"]) == 2
    err = capsys.readouterr().err
    assert f"did you mean `opscan {meant}`?" in err and "Traceback" not in err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here: the snippet runs")
def test_a_snippet_run_off_a_mac_exits_2_and_says_why(tmp_path):
    from opscan.repro.snippet import snippet_text

    call = {"probe": {"op": "aten::take", "spec": {"args": [{"t": 0}, {"t": 1}], "kwargs": {}},
                      "tensors": [{"dtype": "float32", "shape": [2, 3], "stride": [3, 1]},
                                  {"dtype": "int64", "shape": [2], "stride": [1], "values": [0, 4]}]}}
    path = tmp_path / "repro.py"
    path.write_text(snippet_text(call, "mps"))
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    off_mac = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert off_mac.returncode == 2, off_mac.stdout  # never 1, "reproduced", where there is no MPS
    assert re.fullmatch(r"cannot run here: no mps on this machine .*\n", off_mac.stdout)
    on_cpu = subprocess.run([sys.executable, str(path), "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert on_cpu.returncode == 0 and "agreed with the CPU" in on_cpu.stdout


# --- upgrade advice ----------------------------------------------------------------------------------------------

NAMED = re.compile(r"(?:upgrade to|upgrade:|fixes it|native from|from) torch (\d+\.\d+(?:\.\d+)?)")


def covered(release: str) -> bool:
    from opscan.knowledge.entry import load_store

    releases = {line.release for line in load_store().index}
    return release in releases or any(r.startswith(release + ".") for r in releases)


def test_upgrade_advice_names_only_releases_opscan_covers():
    # every text a remedy, a fix or the upgrade advice is made from: the knowledge base's data and the predict stage
    sources = [*(REPO / "opscan" / "knowledge").glob("*.yaml"), *(REPO / "opscan" / "predict").glob("*.py")]
    named = {(path.name, m.group(1)) for path in sources for m in NAMED.finditer(path.read_text(encoding="utf-8"))}
    assert named and [n for n in named if not covered(n[1])] == []
    from opscan.knowledge.silent_bugs import load_bugs

    assert all(covered(bug.fixed_in) for bug in load_bugs() if bug.fixed_in)
    # and what a scan says: a step judged for torch 2.0.0, whose rows are native later
    from opscan.scan import ScanOptions, scan

    report = scan(ScanOptions(f"{REPO / 'tests' / 'targets' / 'tiny.py'}:build_model", torch_version="2.0.0",
                              memory=False))
    texts = [report.upgrade["text"], *(f.fix or "" for f in report.findings),
             *(f.upstream.text for f in report.findings), *(r.remedy or "" for r in report.rows)]
    said = {m.group(1) for text in texts for m in NAMED.finditer(text)}
    assert all(covered(release) for release in said), said


# --- long work ---------------------------------------------------------------------------------------------------


class Terminal:
    """A stream that says it is a terminal, keeping what is written."""

    def __init__(self):
        self.written = []

    def isatty(self):
        return True

    def write(self, text):
        self.written.append(text)

    def flush(self):
        pass


def test_the_stages_show_on_a_terminal_and_nothing_when_piped_or_quiet():
    import io

    from opscan.cli.progress import StageDisplay, display_for

    assert display_for(io.StringIO(), 0) is None  # piped: nothing drawn
    assert display_for(Terminal(), 1) is None  # -q
    terminal = Terminal()
    display = display_for(terminal, 0)
    assert isinstance(display, StageDisplay)
    display("judging 4,547 calls for torch 2.14.1")
    display.live.refresh()
    display(None)  # the work ended: the line is cleared
    shown = "".join(terminal.written)
    assert "judging 4,547 calls for torch 2.14.1 · 0 s" in shown and not display.started


def test_a_long_real_tensor_step_suggests_fake_with_the_time_it_saves():
    from opscan.cli.progress import fake_advice

    timings = [("calling build_model()", 3.1), ("running the training step of gpt2.py:build_model", 39.2),
               ("judging 4,547 calls for torch 2.14.1", 0.9)]
    advice = fake_advice(timings, 4074, fake=False)
    assert advice.startswith("the step ran on real tensors for 42 s; --fake builds and traces it with fake tensors")
    assert "about 2 s for its 4,074 calls, saving about 40 s" in advice
    assert fake_advice(timings, 4074, fake=True) is None  # already fake
    assert fake_advice([("running the training step of m.py:f", 4.0)], 4074, fake=False) is None  # short: no hint
    # a step whose calls would take a fake trace about as long: nothing to save
    assert fake_advice([("running the training step of m.py:f", 12.0)], 12000, fake=False) is None
