"""Careless environments, the files: a full disk or a file-size limit, a full or closed stdout, a damaged journal
and an output folder that holds another target's results — through `python -m opscan`, every promise checked
(helpers_hostile.check). A file is written whole or not at all: a temporary name, then a rename.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess

import pytest

from conftest import TARGETS
from helpers_hostile import TINY, check, files_in, opscan, target

FAST = ("--no-memory", "--no-fx")
SIZE_LIMIT = 20_000  # bytes: report.json of tiny (~34 KB) and graph.graphml (~54 KB) pass it, the marker does not


def _file_size_limit():
    """preexec: no file of this process may grow past SIZE_LIMIT bytes (writes then fail with EFBIG)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (SIZE_LIMIT, SIZE_LIMIT))


# --- item 6: writes ----------------------------------------------------------------------------------------


def test_a_file_size_limit_is_exit_2_naming_the_file_and_leaves_nothing_partial(tmp_path):
    out = tmp_path / "out"
    run = opscan(TINY, "-o", str(out), "-f", "json", *FAST, preexec=_file_size_limit)
    check(run, 2, ("cannot write", "File too large", "ulimit -f"), fmt="json", folders=[out])
    assert not out.exists()  # nothing was renamed into place, and the folder made for the run is gone


def test_a_failed_rewrite_keeps_the_earlier_reports_whole(tmp_path):
    out = tmp_path / "out"
    check(opscan(TINY, "-o", str(out), *FAST), 0, folders=[out])
    before = files_in(out)
    run = opscan(TINY, "-o", str(out), "-f", "yaml", *FAST, preexec=_file_size_limit)
    check(run, 2, "File too large", fmt="yaml", folders=[out])
    assert files_in(out) == before  # the earlier run's files, byte for byte


def test_a_file_size_limit_on_the_probe_journal_is_exit_2(tmp_path):
    out = tmp_path / "out"
    run = opscan(TINY, "-o", str(out), "--probe", "--device", "cpu", "--workers", "1", *FAST,
                 preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000)))
    check(run, 2, ("cannot write the journal", "probes.jsonl", "--resume"), folders=[out])


def test_a_bundle_under_a_file_size_limit_leaves_no_partial_bundle(tmp_path):
    run = opscan("bundle", TINY, "--device", "cpu", "-o", str(tmp_path / "b"), "--no-fx",
                 preexec=_file_size_limit)
    check(run, 2, ("cannot write", "File too large"))
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.zip").exists()


def test_stdout_on_a_full_device_is_exit_2(tmp_path):
    with open("/dev/full", "wb") as full:
        run = opscan(TINY, "-o", str(tmp_path), "-f", "json", *FAST, stdout=full)
    check(run, 2, ("cannot write the output to stdout", "No space left on device"), folders=[tmp_path])


def test_a_closed_stdout_is_exit_2(tmp_path):
    run = opscan(TINY, "-o", str(tmp_path), "-f", "json", *FAST, stdout=subprocess.DEVNULL,
                 preexec=lambda: __import__("os").close(1))
    check(run, 2, "stdout is closed", folders=[tmp_path])
    assert json.loads((tmp_path / "report.json").read_text())["model"] == TINY  # the files are written all the same


def test_a_reader_that_stops_early_is_not_an_error_for_bundle(tmp_path):
    # `opscan bundle ... | true`: the paths it prints meet a closed pipe (print() used to raise: exit 3)
    read, write = __import__("os").pipe()
    __import__("os").close(read)
    with open(write, "wb") as pipe:
        run = opscan("bundle", TINY, "--device", "cpu", "-o", str(tmp_path / "b"), "--no-fx", stdout=pipe)
    check(run, 0, "wrote the bundle", folders=[tmp_path / "b"])


# --- item 8: a damaged journal ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A measured run of tiny on the CPU: its folder, with report.json and probes.jsonl."""
    out = tmp_path_factory.mktemp("measured") / "out"
    check(opscan(TINY, "-o", str(out), "--probe", "--device", "cpu", "--workers", "1", *FAST), 0, folders=[out])
    return out


@pytest.mark.parametrize("damage, why", [
    (lambda lines: lines[:4] + [b"\xff\xfe\x00 binary"] + lines[5:], "damaged at line 5 (UnicodeDecodeError)"),
    (lambda lines: lines[:6] + [b'{"kind": "outcome", "probe": '] + lines[7:], "damaged at line 7 (JSONDecodeError)"),
    (lambda lines: lines[:3] + [b"[1, 2]"] + lines[4:], "damaged at line 4 (not a JSON object)"),
    (lambda lines: lines[:8] + [b'{"kind": "outcome", "probe": 5}'] + lines[9:], "damaged at line 9 (not an outcome"),
])
def test_resume_on_a_damaged_journal_is_exit_2_naming_the_line(measured, tmp_path, damage, why):
    out = tmp_path / "out"
    shutil.copytree(measured, out)
    journal = out / "probes.jsonl"
    journal.write_bytes(b"\n".join(damage(journal.read_bytes().split(b"\n"))))
    before = files_in(out)
    run = opscan(TINY, "-o", str(out), "--probe", "--device", "cpu", "--workers", "1", "--resume", *FAST)
    check(run, 2, (f"the journal {journal} is {why}", "delete it or drop --resume"))
    assert files_in(out) == before  # nothing rewritten, nothing deleted


# --- item 9: an output folder that holds another target's results ---------------------------------------


def test_a_folder_of_another_target_is_refused_and_kept(measured, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(measured, out)
    before = files_in(out)
    run = opscan(target("linear_only"), "--input", "3x4:float32", "-o", str(out), "-f", "json", *FAST)
    check(run, 2, (f"{out} holds the results of another target ({TINY})", "pass -o with another folder"),
          fmt="json")
    assert files_in(out) == before


def test_the_default_folder_of_another_target_with_the_same_model_name_is_refused(tmp_path):
    other = tmp_path / "other.py"
    other.write_text((TARGETS / "tiny.py").read_text())  # the same model (Sequential), another TARGET
    check(opscan(TINY, *FAST, cwd=tmp_path), 0)
    before = files_in(tmp_path / "reports")
    run = opscan(f"{other}:build_model", *FAST, cwd=tmp_path)
    check(run, 2, ("reports/Sequential holds the results of another target", TINY))
    assert files_in(tmp_path / "reports") == before


def test_an_earlier_report_without_a_marker_still_names_its_target(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"model": "somewhere/else.py:build"}))  # an older opscan's report
    run = opscan(TINY, "-o", str(out), *FAST)
    check(run, 2, "holds the results of another target (somewhere/else.py:build)")
    assert [p.name for p in out.iterdir()] == ["report.json"]


def test_the_same_targets_folder_is_reused_and_its_journal_kept(measured, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(measured, out)
    journal = (out / "probes.jsonl").read_bytes()
    run = opscan(TINY, "-o", str(out), "-f", "json", *FAST)  # predicted this time: the journal stays for --resume
    check(run, 0, fmt="json", folders=[out])
    assert (out / "probes.jsonl").read_bytes() == journal
