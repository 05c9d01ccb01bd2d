"""Issue 36 (security and hardening, round 4) on its own, unit by unit: the trusted reader's value errors, the
writers' files (O_EXCL|O_NOFOLLOW, no link under -o followed), the recorded command line, the escapers per output
kind, redaction, names, supports(), SARIF, analyze()'s isolation, the zoo journal and families. Each test names
the issue's item it proves; the same promises through `python -m opscan` are tests/test_hostile_round4.py's."""

from __future__ import annotations

import json
import re
import sys

import pytest

from opscan.errors import UsageError
from opscan.trust.read import Malformed, json_value, read_json, read_yaml, yaml_value

LONG_INT = "9" * (sys.get_int_max_str_digits() + 1)


# --- the reader: every error a value can raise ----------------------------------------------------------------


def test_a_json_integer_too_long_for_int_is_malformed_naming_its_field():
    with pytest.raises(Malformed, match=r"ops\[1\]\.calls: an integer of 4301 digits"):
        json_value('{"ops": [{"calls": 1}, {"calls": ' + LONG_INT + "}]}")


@pytest.mark.parametrize("text, field", [
    ('{"a": {"b": NaN}}', "a.b: NaN"), ('{"a": [Infinity]}', r"a\[0\]: Infinity"),
    ('{"x": -Infinity}', "x: -Infinity"), ('{"x": 1e999}', "x: a number too large for a float"),
])
def test_json_that_is_not_strict_json_is_malformed_naming_its_field(text, field):
    with pytest.raises(Malformed, match=field):
        json_value(text)


def test_a_lone_surrogate_in_json_is_malformed_naming_its_field():
    with pytest.raises(Malformed, match=r"model: a lone surrogate"):
        json_value('{"model": "x\\ud800y"}')
    assert json_value('{"model": "\\ud83d\\ude00"}') == {"model": "\U0001f600"}  # a pair is one character


@pytest.mark.parametrize("text, says", [
    ("models:\n  m:\n    added: 2023-02-30\n", r"models\.m\.added \(line 3, column 12\).*day is out of range"),
    ("seed: " + LONG_INT + "\n", r"seed \(line 1, column 7\).*integer"),
    ("seed: [1, " + ":".join(["1"] * 3000) + "]\n", r"seed\[1\] \(line 1"),
])
def test_yaml_values_that_cannot_be_built_are_malformed_naming_their_field(text, says):
    with pytest.raises(Malformed, match=says):
        yaml_value(text)


def test_the_files_readers_say_the_file_and_the_field(tmp_path):
    (tmp_path / "r.json").write_text('{"model": ' + LONG_INT + "}")
    with pytest.raises(UsageError, match=r"the baseline .*r\.json is not an opscan report.json \(model: an integer"):
        read_json(tmp_path / "r.json", "the baseline", "fix", expected="an opscan report.json")
    (tmp_path / "z.yaml").write_text("models:\n  m: {target: 'x.py:f', when: 2021-13-01}\n")
    with pytest.raises(UsageError, match=r"the manifest .*z\.yaml is not valid YAML \(models\.m\.when"):
        read_yaml(tmp_path / "z.yaml", "the manifest", "fix")


# --- writing: O_EXCL|O_NOFOLLOW temporaries, no link below -o followed, removal never through a link ----------


def _planted(folder, outside, names):
    """Symbolic links at `names` in `folder`, each to its own file outside (which must stay as it is)."""
    for name in names:
        (outside / name).write_text("victim")
        (folder / name).symlink_to(outside / name)


def test_high_1_planted_temporary_names_are_never_opened(tmp_path):
    import os

    from opscan.cli.files import prepare_folder, write_whole
    from opscan.target.run import RunContext

    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir(), outside.mkdir()
    pid = os.getpid()  # the names main's writer would use: .NAME.PID.opscan-tmp, .opscan-write-test.PID
    _planted(out, outside, [f".report.json.{pid}.opscan-tmp", f".report.yaml.{pid}.opscan-tmp",
                            f".opscan-write-test.{pid}"])
    ctx = RunContext()
    prepare_folder(ctx, out)
    write_whole(ctx, {out / "report.json": "{}\n", out / "report.yaml": "a: 1\n"}, root=out)
    assert {p.name: p.read_text() for p in outside.iterdir()} == {n: "victim" for n in os.listdir(outside)}
    assert (out / "report.json").read_text() == "{}\n" and not (out / "report.json").is_symlink()
    assert sorted(p.name for p in out.iterdir() if not p.is_symlink()) == ["report.json", "report.yaml"]


def test_high_1_a_link_at_the_final_name_is_replaced_not_written_through(tmp_path):
    from opscan.cli.files import write_whole
    from opscan.target.run import RunContext

    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir(), outside.mkdir()
    _planted(out, outside, ["report.json"])
    write_whole(RunContext(), {out / "report.json": "{}\n"}, root=out)
    assert (outside / "report.json").read_text() == "victim" and (out / "report.json").read_text() == "{}\n"


def test_high_2_a_linked_folder_below_the_output_folder_is_refused(tmp_path):
    from opscan.cli.files import write_under
    from opscan.errors import OutputError
    from opscan.target.run import RunContext

    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir(), outside.mkdir()
    (out / "repro").symlink_to(outside)
    with pytest.raises(OutputError, match=r"repro is a symbolic link: opscan never writes .* through a link"):
        write_under(RunContext(), out, {"repro/aten_take/ISSUE.md": "x", "report.json": "{}"})
    assert list(outside.iterdir()) == [] and not (out / "report.json").exists()  # nothing, anywhere


def test_high_2_stale_repro_files_are_never_removed_through_a_link(tmp_path):
    from opscan.cli.files import remove_stale, stale_repro

    out, outside = tmp_path / "out", tmp_path / "outside"
    (outside / "aten_take").mkdir(parents=True)
    (outside / "aten_take" / "ISSUE.md").write_text("someone else's")
    (out / "repro").mkdir(parents=True)
    (out / "repro" / "aten_take").symlink_to(outside / "aten_take")  # a linked op folder
    assert stale_repro(out, set()) == []
    (out / "repro" / "aten_take").unlink()
    (out / "repro" / "aten_take").mkdir()
    (out / "repro" / "aten_take" / "ISSUE.md").write_text("ours")
    stale = stale_repro(out, set())
    (out / "repro" / "aten_take" / "ISSUE.md").unlink()  # swapped for a link between the listing and the removal
    (out / "repro" / "aten_take").rmdir()
    (out / "repro" / "aten_take").symlink_to(outside / "aten_take")
    remove_stale(stale, out / "repro")
    assert (outside / "aten_take" / "ISSUE.md").read_text() == "someone else's"
    (out / "repro").rename(tmp_path / "old")
    (out / "repro").symlink_to(outside)  # a linked repro/: nothing in it is ours
    assert stale_repro(out, set()) == []


def test_high_1_journals_are_never_opened_through_a_link(tmp_path):
    from opscan.probe.journal import Journal, JournalError

    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir(), outside.mkdir()
    _planted(out, outside, ["probes.jsonl"])
    Journal(out / "probes.jsonl", "fp", "cpu", 1, resume=False)._file.close()  # fresh: the link is replaced
    assert (outside / "probes.jsonl").read_text() == "victim" and not (out / "probes.jsonl").is_symlink()
    victim = '{"kind":"header","journal":1,"fingerprint":"fp","device":"cpu","probes":1}\n{"kind":"environment"'
    (out / "probes.jsonl").unlink()
    (outside / "probes.jsonl").write_text(victim)  # reads as a journal with a torn last line
    (out / "probes.jsonl").symlink_to(outside / "probes.jsonl")
    with pytest.raises(JournalError, match=r"cannot write the journal .*probes.jsonl: .*link"):
        Journal(out / "probes.jsonl", "fp", "cpu", 1, resume=True)  # resumed: never truncated or appended through it
    assert (outside / "probes.jsonl").read_text() == victim


# --- redaction, names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, redacted", [
    ("--data=/Users/alice/x.pt", "--data=~/x.pt"), ("file:///Users/alice/m.py", "file:~/m.py"),
    ("//Users/alice/m.py", "~/m.py"), ("/Users//alice/m.py", "~/m.py"), ("/Users/./alice/m.py", "~/m.py"),
    ("/users/alice/m.py", "~/m.py"), ("/System/Volumes/Data/Users/alice/m.py", "/System/Volumes/Data~/m.py"),
    ("C:\\Users\\alice\\m.py", "C:~\\m.py"), ("%2FUsers%2Falice%2Fm.py", "~%2Fm.py"),
    ("token=/home/bob/k", "token=~/k"), ("~alice/m.py", "~/m.py"),
    ("at /Users/runner/work/x.mm:14", "at /Users/runner/work/x.mm:14"),
])
def test_a_mac_users_name_is_redacted_in_every_form(text, redacted):
    from opscan.repro.redact import Redaction

    assert Redaction(project=None, home="/nonexistent-home").text(text) == redacted


def test_a_name_under_the_character_cap_but_over_255_bytes_is_bounded():
    from opscan.trust.names import NAME_BYTES, safe_name

    wide = "\U0001d400" * 90  # MATHEMATICAL BOLD CAPITAL A: a letter, four bytes in UTF-8
    name = safe_name(wide)
    assert len(name.encode("utf-8")) <= NAME_BYTES < 255 - len(".zip") and name != safe_name(wide + "x")
    assert safe_name("ü" * 90) == "ü" * 90  # 180 bytes: fits as it is


# --- supports() ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kwargs, says", [
    (("aten::add.Tensor", ["flaot32"]), {}, "'flaot32' is not a torch dtype — did you mean float32?"),
    (("aten::add.Tensor", "half"), {}, "'half' is not a torch dtype — torch calls it float16"),
    (("aten::add.Tensor", [3]), {}, "dtype 3 is of type int, not a dtype name"),
    (("aten::add.Tensor", 3), {}, "dtypes=3 is of type int"),
    ((5,), {}, "op=5 is of type int, not an operator"),
    (("aten::take",), {"release": 2.14}, "release=2.14 is of type float, not text"),
    (("aten::take",), {"macos": 15}, "macos=15 is of type int, not text"),
])
def test_supports_refuses_what_is_not_a_dtype_op_or_release_with_the_librarys_error(args, kwargs, says):
    import opscan

    with pytest.raises(UsageError) as caught:
        opscan.supports(*args, **kwargs)
    assert says in str(caught.value)


def test_supports_takes_torch_dtypes_too():
    import torch

    import opscan

    assert opscan.supports("aten::add.Tensor", [torch.float16, "float16"], release="2.14.1").dtypes == \
        ("float16", "float16")


# --- analyze()'s isolation -------------------------------------------------------------------------------------


def test_a_forward_hook_writing_into_a_dict_the_model_holds_is_an_isolation_error():
    import torch
    from torch import nn

    import opscan
    from opscan.api.isolation import IsolationError

    model = nn.Linear(4, 2)
    model.seen = {}
    seen = model.seen  # the caller's dict: the copy's hook still holds it

    def hook(module, args, out):
        seen["last"] = out.detach()

    model.register_forward_hook(hook)
    with pytest.raises(IsolationError, match=r"the scan changed your objects: model\.seen"):
        opscan.analyze(model, torch.randn(3, 4), memory=False, fx=False)


class _Stubborn:
    """A module whose deepcopy gives back itself."""

    def __deepcopy__(self, memo):
        return self


def test_a_deepcopy_that_returns_self_is_refused_before_the_weights_are_stepped():
    import torch
    from torch import nn

    import opscan
    from opscan.api.isolation import IsolationError

    class Net(_Stubborn, nn.Linear):
        pass

    model = Net(4, 2)
    before = model.weight.detach().clone()
    with pytest.raises(IsolationError, match=r"copying your objects gave back your own: the model.*nothing was run"):
        opscan.analyze(model, torch.randn(3, 4), memory=False, fx=False)
    assert torch.equal(model.weight, before) and model.weight.grad is None  # never stepped, never backwarded

    class Inner(_Stubborn, nn.Linear):
        pass

    outer = nn.Sequential(Inner(4, 4), nn.Linear(4, 2))
    before = outer[0].weight.detach().clone()
    with pytest.raises(IsolationError, match=r"gave back your own: \.0\.weight, \.0\.bias"):
        opscan.analyze(outer, torch.randn(3, 4), memory=False, fx=False)
    assert torch.equal(outer[0].weight, before)


# --- the zoo ---------------------------------------------------------------------------------------------------


def test_an_import_error_inside_a_family_is_reported_as_itself_not_as_a_missing_library(monkeypatch):
    from opscan.zoo import families

    def broken():
        raise ImportError("cannot import name '_C' from partially initialized module 'torchvision'",
                          name="torchvision")

    monkeypatch.setattr(families, "torchvision_models", broken)
    with pytest.raises(UsageError) as caught:
        families.family("torchvision")
    said = str(caught.value)
    assert "is installed but importing it failed (ImportError: cannot import name '_C'" in said, said
    assert "needs torchvision installed" not in said
    monkeypatch.setattr(families, "installed", lambda library: False)  # really missing: the old line stands
    with pytest.raises(UsageError, match=r"the torchvision family needs torchvision installed \(pip install"):
        families.family("torchvision")


def test_a_damaged_zoo_journal_line_is_exit_2_naming_it(tmp_path):
    from opscan.zoo import journal

    path = tmp_path / journal.JOURNAL_NAME
    header = journal.line(journal.header("zoo", ("2.14.1",)))
    for line, why in (('{"kind": "model", "result": {}}', "a model line without its key"),
                      ('{"kind": "mode1", "key": "m"}', "an unknown kind of record ('mode1')"),
                      ("[1, 2]", "a JSON list, not a record")):
        path.write_text(header + line + "\n")
        with pytest.raises(UsageError, match=rf"zoo journal .*zoo\.jsonl, line 2: {re.escape(why)} — delete that line"):
            journal.read(path, ("2.14.1",))


# --- ISSUE.md: Markdown and HTML from a report or a Mac stay inert ------------------------------------------------


HOSTILE_MD = {"html": "<img src=x onerror=alert(1)>", "link": "[click](https://evil.example)", "mention": "@pytorch/x",
              "heading": "\n# fake heading", "table": "a | b", "fence": "```"}


@pytest.fixture(scope="module")
def scanned_take(tmp_path_factory):
    """A predicted scan of the take pair with --repro: its report.json, as a dict."""
    from conftest import TARGETS
    from opscan.cli import main

    out = tmp_path_factory.mktemp("take") / "out"
    assert main([f"{TARGETS / 'baseline_pair.py'}:build_model", "--arg", "take=True", "--repro", "-o", str(out),
                 "--no-memory", "--no-fx", "-q"]) == 0
    return json.loads((out / "report.json").read_text())


def _outside_code(markdown: str) -> str:
    """The Markdown with its fenced blocks and code spans taken out: what GitHub renders as Markdown and HTML."""
    without_fences = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1\s*$", "", markdown)
    return re.sub(r"`[^`\n]*`", "", without_fences)


def test_markdown_and_html_from_a_report_and_a_mac_stay_out_of_issue_md(scanned_take):
    import copy

    from opscan.repro import render_files

    report = copy.deepcopy(scanned_take)
    evil = " ".join(HOSTILE_MD.values())
    finding = next(f for f in report["repro"]["findings"] if f["op"] == "aten::take")
    finding["dtypes"] = [evil, "int64"]
    finding["shapes"] = [[evil]]
    report["environment"]["torch"] = evil
    report["repro"]["measured_on"] = evil
    probe = finding["calls"][0]["probe"]["id"]
    real = {probe: {"device": evil, "exit_code": evil, "output": "ran",
                    "environment": {"macos": evil, "chip": evil, "fallback_env": evil}}}
    issue = render_files(report, real_outputs=real, every_finding=True)["repro/aten_take/ISSUE.md"]
    # take's cause is the missing-ops tracker's: drafted (--draft), its title after the note saying why not filed
    title = next(line for line in issue.splitlines() if line.startswith("# "))
    assert title.startswith("# [") and "<" not in _outside_code(title)
    rendered = _outside_code(issue)
    for name, text in HOSTILE_MD.items():
        assert text.strip() not in rendered, (name, rendered)
    assert not re.search(r"(?m)^# fake heading", rendered) and "<img" not in rendered
    snippet = issue.split("````python\n", 1)[1].split("````", 1)[0]  # the device a maintainer's paste runs on
    assert 'else "<img src=x onerror=alert(1)> [click](https://evil.example) @pytorch/x \\n# fake' in snippet
    compile(snippet, "repro.py", "exec")  # still Python: the device is a string literal, never code


def test_a_macs_repro_line_with_a_null_output_or_a_listed_collect_env_still_renders(scanned_take):
    from opscan.repro import render_files

    finding = next(f for f in scanned_take["repro"]["findings"] if f["op"] == "aten::take")
    probe = finding["calls"][0]["probe"]["id"]
    real = {probe: {"device": "mps", "exit_code": 1, "output": None,  # null: what results' SHAPES allow
                    "environment": {"collect_env": ["PyTorch version: 2.14.1"], "macos": 15}}}
    issue = render_files(scanned_take, real_outputs=real, every_finding=True)["repro/aten_take/ISSUE.md"]
    assert "Output on mps (exit code 1):" in issue and "['PyTorch version: 2.14.1']" in issue and "`15`" in issue
