"""Careless environments, the files: a full disk or a file-size limit, a full or closed stdout, a damaged journal
and an output folder that holds another target's results — through `python -m opscan`, every promise checked
(helpers_hostile.check). A file is written whole or not at all: a temporary name, then a rename. The runs are
independent: they start together (helpers_hostile.run_all), after one measured run whose folder some of them
start from.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from conftest import TARGETS
from helpers_hostile import TINY, check, files_in, opscan, run_all, target

FAST = ["--no-memory", "--no-fx"]
SIZE_LIMIT = 20_000  # bytes (ulimit -f): less than tiny's report.json (~34 KB) and graph.graphml (~54 KB)
PROBE = ["--probe", "--device", "cpu", "--workers", "1"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A measured run of tiny on the CPU: its folder, with report.json and probes.jsonl."""
    out = tmp_path_factory.mktemp("measured") / "out"
    check(opscan(TINY, "-o", str(out), *PROBE, *FAST), 0, folders=[out])
    return out


def _damaged(measured, damage):
    """setup: a copy of the measured folder whose journal `damage` changed (lines -> lines)."""
    def setup(folder):
        shutil.copytree(measured, folder / "out")
        journal = folder / "out" / "probes.jsonl"
        journal.write_bytes(b"\n".join(damage(journal.read_bytes().split(b"\n"))))
    return setup


def _copy_of(measured, where: str = "out"):
    return lambda folder: shutil.copytree(measured, folder / where)


def _same_model_elsewhere(folder):
    (folder / "other.py").write_text((TARGETS / "tiny.py").read_text())  # the same model (Sequential), another TARGET


def _older_report(folder):
    (folder / "out").mkdir()
    (folder / "out" / "report.json").write_text(json.dumps({"model": "somewhere/else.py:build"}))


@pytest.fixture(scope="module")
def ran(measured, tmp_path_factory):
    """Every case, run at once: name -> (Run, the case's folder)."""
    cases = {
        "size_limit": {"argv": [TINY, "-o", "{dir}/out", "-f", "json", *FAST], "file_size": SIZE_LIMIT},
        "size_limit_rewrite": {"argv": [TINY, "-o", "{dir}/out", "-f", "yaml", *FAST], "file_size": SIZE_LIMIT,
                               "setup": _copy_of(measured)},
        "journal_limit": {"argv": [TINY, "-o", "{dir}/out", *PROBE, *FAST], "file_size": 4000},
        "bundle_limit": {"argv": ["bundle", TINY, "--device", "cpu", "-o", "{dir}/b", "--no-fx"],
                         "file_size": SIZE_LIMIT},
        "stdout_full": {"argv": [TINY, "-o", "{dir}/out", "-f", "json", *FAST], "stdout": "full"},
        "stdout_closed": {"argv": [TINY, "-o", "{dir}/out", "-f", "json", *FAST], "stdout": "closed"},
        "stdout_broken": {"argv": ["bundle", TINY, "--device", "cpu", "-o", "{dir}/b", "--no-fx"], "stdout": "broken"},
        "journal_binary": {"argv": [TINY, "-o", "{dir}/out", *PROBE, "--resume", *FAST],
                           "setup": _damaged(measured, lambda ls: ls[:4] + [b"\xff\xfe\x00 binary"] + ls[5:])},
        "journal_torn": {"argv": [TINY, "-o", "{dir}/out", *PROBE, "--resume", *FAST],
                         "setup": _damaged(measured, lambda ls: ls[:6] + [b'{"kind": "outcome", "probe": '] + ls[7:])},
        "another_target": {"argv": [target("linear_only"), "--input", "3x4:float32", "-o", "{dir}/out", "-f", "json",
                                    *FAST], "setup": _copy_of(measured)},
        "same_model_name": {"argv": ["{dir}/other.py:build_model", *FAST], "cwd": True,
                            "setup": lambda f: (_copy_of(measured, "reports/Sequential")(f), _same_model_elsewhere(f))},
        "older_report": {"argv": [TINY, "-o", "{dir}/out", *FAST], "setup": _older_report},
        "same_target": {"argv": [TINY, "-o", "{dir}/out", "-f", "json", *FAST], "setup": _copy_of(measured)},
    }
    return run_all(cases, tmp_path_factory.mktemp("files"))


# --- item 6: writes ----------------------------------------------------------------------------------------


def test_a_file_size_limit_is_exit_2_naming_the_file_and_leaves_nothing_partial(ran):
    run, folder = ran["size_limit"]
    check(run, 2, ("cannot write", "File too large", "ulimit -f"), fmt="json", folders=[folder / "out"])
    assert not (folder / "out").exists()  # nothing was renamed into place, and the folder made for the run is gone


def test_a_failed_rewrite_keeps_the_earlier_reports_whole(ran, measured):
    run, folder = ran["size_limit_rewrite"]
    check(run, 2, "File too large", fmt="yaml", folders=[folder / "out"])
    assert files_in(folder / "out") == files_in(measured)  # the earlier run's files, byte for byte


def test_a_file_size_limit_on_the_probe_journal_is_exit_2(ran):
    run, folder = ran["journal_limit"]
    check(run, 2, ("cannot write the journal", "probes.jsonl", "--resume"), folders=[folder / "out"])


def test_a_bundle_under_a_file_size_limit_leaves_no_partial_bundle(ran):
    run, folder = ran["bundle_limit"]
    check(run, 2, ("cannot write", "File too large"))
    assert not (folder / "b").exists() and not (folder / "b.zip").exists()


def test_stdout_on_a_full_device_is_exit_2(ran):
    run, folder = ran["stdout_full"]
    check(run, 2, ("cannot write the output to stdout", "No space left on device"), folders=[folder / "out"])


def test_a_closed_stdout_is_exit_2(ran):
    run, folder = ran["stdout_closed"]
    check(run, 2, "stdout is closed", folders=[folder / "out"])
    assert json.loads((folder / "out" / "report.json").read_text())["model"] == TINY  # the files are written


def test_a_reader_that_stops_early_is_not_an_error_for_bundle(ran):
    # `opscan bundle ... | true`: the paths it prints meet a closed pipe (print() used to raise: exit 3)
    run, folder = ran["stdout_broken"]
    check(run, 0, "wrote the bundle", folders=[folder / "b"])


# --- item 8: a damaged journal ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, why", [
    ("journal_binary", "is damaged at line 5 (not UTF-8 text, byte 0: invalid start byte)"),
    ("journal_torn", "is damaged at line 7 (JSONDecodeError at line 1 column"),  # a torn line that is not the last one
])
def test_resume_on_a_damaged_journal_is_exit_2_naming_the_line(ran, measured, name, why):
    run, folder = ran[name]
    journal = folder / "out" / "probes.jsonl"
    check(run, 2, (f"the journal {journal} {why}", "delete it or drop --resume"))
    assert files_in(folder / "out").keys() == files_in(measured).keys()  # nothing rewritten, nothing deleted
    assert (folder / "out" / "report.json").read_bytes() == (measured / "report.json").read_bytes()


@pytest.mark.parametrize("line, why", [
    (b"[1, 2]", "damaged at line 3 (not a JSON object)"),
    (b"[" * 5000 + b"]" * 5000, "damaged at line 3 (nested deeper than"),  # trust/read.py's depth limit, no RecursionError
    (b'{"kind": "outcome", "probe": 5}', "damaged at line 3 (not an outcome"),
    (b'{"kind": "mystery"}', "damaged at line 3 (an unknown record 'mystery')"),
])
def test_a_journal_line_that_is_not_a_record_is_named(measured, tmp_path, line, why):
    from opscan.probe.journal import JournalError, read_journal

    lines = (measured / "probes.jsonl").read_bytes().split(b"\n")
    header = json.loads(lines[0])
    path = tmp_path / "probes.jsonl"
    path.write_bytes(b"\n".join([*lines[:2], line, *lines[3:]]))
    with pytest.raises(JournalError, match=re.escape(why)):
        read_journal(path, header["fingerprint"])
    path.write_bytes(b"\n".join(lines[:-2]) + b"\n" + lines[-2][:20])  # a torn LAST line is dropped, not refused
    assert read_journal(path, header["fingerprint"])[2] == len(b"\n".join(lines[:-2]) + b"\n")


# --- item 9: an output folder that holds another target's results ---------------------------------------


def test_a_folder_of_another_target_is_refused_and_kept(ran, measured):
    run, folder = ran["another_target"]
    check(run, 2, (f"{folder / 'out'} holds the results of another target ({TINY})", "pass -o with another folder"),
          fmt="json")
    assert files_in(folder / "out") == files_in(measured)


def test_the_default_folder_of_another_target_with_the_same_model_name_is_refused(ran, measured):
    run, folder = ran["same_model_name"]
    check(run, 2, ("reports/Sequential holds the results of another target", TINY))
    assert files_in(folder / "reports" / "Sequential") == files_in(measured)


def test_an_earlier_report_without_a_marker_still_names_its_target(ran):
    run, folder = ran["older_report"]  # a report.json of an opscan that wrote no .opscan-target.json
    check(run, 2, "holds the results of another target (somewhere/else.py:build)")
    assert [p.name for p in (folder / "out").iterdir()] == ["report.json"]


def test_the_same_targets_folder_is_reused_and_its_journal_kept(ran, measured):
    run, folder = ran["same_target"]  # predicted this time: the journal stays for --resume
    check(run, 0, fmt="json", folders=[folder / "out"])
    assert (folder / "out" / "probes.jsonl").read_bytes() == (measured / "probes.jsonl").read_bytes()
