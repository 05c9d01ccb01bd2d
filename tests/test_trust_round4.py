"""Issue 36 (security and hardening, round 4) on its own, unit by unit: the trusted reader's value errors, the
writers' files (O_EXCL|O_NOFOLLOW, no link under -o followed), the recorded command line, the escapers per output
kind, redaction, names, supports(), SARIF, analyze()'s isolation, the zoo journal and families. Each test names
the issue's item it proves; the same promises through `python -m opscan` are tests/test_hostile_round4.py's."""

from __future__ import annotations

import json
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
