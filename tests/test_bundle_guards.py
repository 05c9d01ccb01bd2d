"""`opscan bundle` guards: no user text can run in run.sh, one run at a time per bundle, and a bundle folder (and
its zip) must be new. A hostile -o name and target path (quotes, $(...), backticks, a newline) are bundled from a
copy of examples/custom_step.py; run.sh parses (`bash -n`), holds none of that text, and running it creates
nothing; README.txt's commands quote the name."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opscan.bundle.remote import BundleRunError, ResultsWriter
from opscan.cli import main

from conftest import EXAMPLES

HOSTILE = 'x"$(touch PWNED)`touch PWNED2`;\ntouch PWNED3 #'


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    folder = root / ("t" + HOSTILE)
    folder.mkdir()
    shutil.copy(EXAMPLES / "custom_step.py", folder / "custom_step.py")
    bundle = root / ("b" + HOSTILE)
    assert main(["bundle", f"{folder}/custom_step.py:build_model", "--device", "cpu", "--workers", "1", "-o",
                 str(bundle), "-q"]) == 0
    return root, bundle


def _run_sh(bundle: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=sys.executable, OPSCAN_SKIP_COLLECT_ENV="1")
    return subprocess.run(["bash", str(bundle / "run.sh")], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_hostile_names_stay_inert(hostile):
    root, bundle = hostile
    run_sh = (bundle / "run.sh").read_text()
    assert subprocess.run(["bash", "-n", str(bundle / "run.sh")]).returncode == 0
    assert "PWNED" not in run_sh and "touch" not in run_sh
    unzip = (bundle / "README.txt").read_text().split("1. unzip ", 1)[1].split(" && cd ", 1)[0]
    assert shlex.split(unzip) == [bundle.name + ".zip"]  # one quoted word, newline and all
    assert json.loads((bundle / "manifest.json").read_text())["target"].startswith(str(root / "t"))
    with ResultsWriter(bundle / "results" / "results.jsonl", {"bundle": "x"})._lock:  # stops run.sh at its check
        proc = _run_sh(bundle, root)
    assert proc.returncode == 2 and not list(root.rglob("PWNED*")), proc.stdout + proc.stderr


def test_a_second_run_is_refused_with_the_pid(hostile, tmp_path):
    _, bundle = hostile
    results = bundle / "results"
    first = ResultsWriter(results / "results.jsonl", {"bundle": "x"})
    (results / "run.pid").write_text("4242\n")
    try:
        with pytest.raises(BundleRunError, match=r"another run.sh is running on this bundle \(pid 4242\)"):
            ResultsWriter(results / "results.jsonl", {"bundle": "x"})
        proc = _run_sh(bundle, tmp_path)  # run.sh refuses before writing anything: one line, exit 2
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.strip().splitlines() == [
            "opscan bundle: error: another run.sh is running on this bundle (pid 4242) — wait for it to finish "
            "(tail -f results/logs/run.log) or stop it, then rerun ./run.sh"]
        assert not (results / "env").exists() and not (results / "logs").exists()
    finally:
        first._file.close()
        first._lock.close()
        shutil.rmtree(results)


def test_the_bundle_folder_and_its_zip_must_be_new(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPSCAN_OUTPUT_DIR", str(tmp_path / "elsewhere"))  # the scan's default: not for bundles
    (tmp_path / "bundles" / "SmallNet").mkdir(parents=True)
    (tmp_path / "bundles" / "SmallNet" / "keep.txt").write_text("mine")
    target = f"{EXAMPLES}/custom_step.py:build_model"
    capsys.readouterr()
    assert main(["bundle", target, "--device", "cpu", "-q"]) == 2
    assert capsys.readouterr().err.strip() == ("opscan: error: bundles/SmallNet already exists and is not empty — "
                                               "pass -o with a new folder for the bundle")
    (tmp_path / "new.zip").write_text("mine")
    assert main(["bundle", target, "--device", "cpu", "-o", "new", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "opscan: error: new.zip already exists — remove it, or pass -o with a new folder for the bundle"
    assert (tmp_path / "new.zip").read_text() == "mine" and not (tmp_path / "elsewhere").exists()
    assert (tmp_path / "bundles" / "SmallNet" / "keep.txt").read_text() == "mine"


def test_merge_of_a_missing_results_file_says_so(tmp_path, capsys):
    from opscan.cli import main

    missing = tmp_path / "results.jsonl"
    assert main(["merge", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"opscan: error: no results file {missing} — pass the results/results.jsonl that run.sh wrote "
                   "on the Mac"]


def test_a_bundle_of_the_earlier_format_is_refused_with_a_request_to_bundle_again(tmp_path, capsys):
    # format 1 stored the scan's argv for merge to parse again; format 2 stores the options as data
    folder = tmp_path / "old"
    (folder / "results").mkdir(parents=True)
    manifest = {"format": 1, "scan_argv": ["m.py:f"], "files": {}, "bundle_hash": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "probes.jsonl").write_text("")
    (folder / "results" / "results.jsonl").write_text("{}\n")
    assert main(["merge", str(folder / "results" / "results.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "made by an earlier opscan (bundle format 1" in err[0] and "opscan bundle" in err[0]


def test_the_manifest_keeps_the_chip_and_reads_a_record_made_before_it():
    """`opscan bundle --chip M2` is stored, so `opscan merge` rescans with the chip the bundle was made for (a
    chip-limited silent-bug entry decides the same way); a record written before the field reads as no chip."""
    from opscan.bundle.options import options_from_data, options_to_data
    from opscan.scan import ScanOptions

    data = options_to_data(ScanOptions("examples/cnn.py:build_model", chip="M2", macos="15.0"))
    assert data["chip"] == "M2" and options_from_data(data).chip == "M2"
    older = {key: value for key, value in data.items() if key != "chip"}
    assert options_from_data(older).chip is None and options_from_data(older).macos == "15.0"
