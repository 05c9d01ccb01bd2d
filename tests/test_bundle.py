"""`opscan bundle` and `opscan merge`, the remote-Mac round trip with `--device cpu` standing in for the Mac.

The bundle of examples/custom_step.py is run by its own run.sh with this interpreter and nothing of opscan
but the bundle's src/ on PYTHONPATH, SIGKILLed (its whole process group) after K results lines, given a torn
last line, rerun, and merged: the merged report equals a direct `opscan TARGET --probe --device cpu --repro`
run's report.json as canonical JSON. Only these differ, and are dropped before comparing:
`measurement.run` (wall time; outcomes reused: all of them in a merge) and `measurement.journal` (the file the
outcomes came from: probes.jsonl there, results.jsonl here). Then a corrupted, tampered, foreign or truncated
results file is refused by merge with exit 2 and one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opscan.bundle.make import VENDORED
from opscan.cli import main

from conftest import EXAMPLES

TARGET = f"{EXAMPLES}/custom_step.py:build_model"
K = 10  # results lines of outcomes before the kill


def _outcomes(path: Path) -> list[tuple[str, str]]:
    lines = [json.loads(raw) for raw in path.read_text().splitlines() if raw.endswith("}")]
    return [(e["probe"], e["pass_name"]) for e in lines if e["kind"] == "outcome"]


def _run_sh(bundle: Path, **extra) -> subprocess.Popen:
    """run.sh as on the Mac: this Python, no opscan on PYTHONPATH (run.sh puts the bundle's src/ there)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTORCH_ENABLE_MPS_FALLBACK")}
    env.update(PYTHON=sys.executable, OPSCAN_SKIP_COLLECT_ENV="1", **extra)
    return subprocess.Popen(["bash", str(bundle / "run.sh")], cwd="/", env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _kill_after(proc: subprocess.Popen, results: Path, k: int) -> int:
    """SIGKILL the run's process group once the results hold k outcomes; how many they held then."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_file() and len(_outcomes(results)) >= k:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return len(_outcomes(results))
        time.sleep(0.005)
    raise AssertionError(f"the run ended before {k} outcomes: {proc.communicate()[0]!r}")


def _canonical(path: Path) -> str:
    doc = json.loads(path.read_text())
    doc["measurement"].pop("run")  # wall time and outcomes reused: vary from run to run
    doc["measurement"].pop("journal")  # probes.jsonl (direct) or results.jsonl (merge)
    return json.dumps(doc, sort_keys=True)


@pytest.fixture(scope="module")
def trip(tmp_path_factory):
    """Bundle, run (killed after K lines, then rerun), and the direct run to compare with."""
    root = tmp_path_factory.mktemp("trip")
    bundle = root / "bundle"
    assert main(["bundle", TARGET, "--device", "cpu", "--workers", "1", "-o", str(bundle), "-q"]) == 0
    results = bundle / "results" / "results.jsonl"
    killed_at = _kill_after(_run_sh(bundle), results, K)
    with open(results, "ab") as f:
        f.write(b'{"kind":"outcome","probe":"torn-by-the-ki')  # a line the kill cut in half
    before = _outcomes(results)
    rerun = _run_sh(bundle)
    log = rerun.communicate(timeout=300)[0].decode()
    assert rerun.returncode == 0, log + (bundle / "results/logs/run.log").read_text()
    direct = root / "direct"
    assert main([TARGET, "--probe", "--device", "cpu", "--workers", "1", "--repro", "-o", str(direct), "-f", "json",
                 "-q"]) == 0
    return {"root": root, "bundle": bundle, "results": results, "before": before, "killed_at": killed_at,
            "direct": direct}


def test_bundle_layout_manifest_and_zip(trip):
    bundle = trip["bundle"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["device"] == "cpu" and manifest["probes"] == len((bundle / "probes.jsonl").read_text().splitlines())
    # the scan options as data (no argv to parse again), repro on so the merge writes the repro files
    assert manifest["scan"]["target"] == TARGET and manifest["scan"]["repro"] is True
    assert "output_dir" not in manifest["scan"] and "probe" not in manifest["scan"]
    assert {f"src/{rel}" for rel in VENDORED} <= set(manifest["files"]) and "run.sh" in manifest["files"]
    import zipfile

    with zipfile.ZipFile(bundle.with_name("bundle.zip")) as archive:
        names = set(archive.namelist())
        assert {f"bundle/{rel}" for rel in [*manifest["files"], "manifest.json"]} == names
        assert archive.getinfo("bundle/run.sh").external_attr >> 16 & 0o111  # executable once unzipped
    assert not any(p.suffix in (".pkl", ".pt", ".pickle") for p in bundle.rglob("*"))


def test_killed_run_resumes_without_running_a_probe_twice(trip):
    results, before = trip["results"], trip["before"]
    assert K <= trip["killed_at"] < json.loads((trip["bundle"] / "manifest.json").read_text())["probes"]
    after = _outcomes(results)
    assert after[:len(before)] == before and len(after) == len(set(after))  # kept, and nothing twice
    lines = [json.loads(raw) for raw in results.read_text().splitlines()]
    kinds = [e["kind"] for e in lines]
    assert kinds[0] == "header" and kinds[-1] == "end" and kinds.count("runner") == 2 and "torn" not in \
        results.read_text()
    assert lines[-1]["counts"]["off"] == len(after) and lines[-1]["counts"]["reused"] == len(before)
    env = {e["pass"]: e["environment"] for e in lines if e["kind"] == "environment"}
    assert env["off"]["fallback_env"] == "unset"
    # a pass's environment is journaled when its first worker says hello, before any of its outcomes
    first_outcome = kinds.index("outcome")
    assert kinds.index("environment") < first_outcome and lines[kinds.index("environment")]["pass"] == "off"
    host = next(e for e in lines if e["kind"] == "host")["files"]
    assert "uname" in host and "Linux" in host["uname"]
    for runner in (e for e in lines if e["kind"] == "runner"):  # every opscan module came from the bundle
        assert runner["modules"] and all(path.startswith("src/") for path in runner["modules"].values())
    assert (trip["bundle"] / "results/env/python_torch.txt").read_text().count("torch")


def test_vendored_modules_need_only_stdlib_and_torch(trip):
    """The runner's and the workers' imports, from the bundle's src/ alone: none of rich, yaml, networkx or
    another opscan; every opscan module they load is vendored, and every vendored module is loaded."""
    src = trip["bundle"] / "src"
    code = ("import json, sys\nimport opscan.bundle.remote, opscan.probe.worker, opscan.probe.zygote, op_probes\n"
            "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items()}))")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, check=True)
    modules = json.loads(out.stdout.splitlines()[-1])
    assert not {"rich", "yaml", "networkx", "opscan.trace", "opscan.scan", "opscan.report"} & set(modules)
    ours = {n: f for n, f in modules.items() if n.split(".")[0] in ("opscan", "op_probes")}
    assert all(Path(f).resolve().is_relative_to(src.resolve()) for f in ours.values())
    loaded = {str(Path(f).resolve().relative_to(src.resolve())) for f in ours.values()}
    assert set(VENDORED) <= loaded | {"opscan/probe/journal.py"}  # journal: resume helpers, imported by none


def test_merge_equals_a_direct_measured_run(trip, tmp_path, capsys):
    capsys.readouterr()
    merged = tmp_path / "merged"
    assert main(["merge", str(trip["results"]), "-o", str(merged), "-f", "json", "-q"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["mode"] == "predicted" and err.startswith("predicted vs measured: 0 rows differ")
    assert _canonical(merged / "report.json") == _canonical(trip["direct"] / "report.json")
    report = json.loads((merged / "report.json").read_text())
    assert report["measurement"]["run"]["reused_outcomes"] == len(_outcomes(trip["results"]))  # nothing ran here
    assert all(r["measured"]["device"] == "cpu" for r in report["ops"] if r.get("measured"))
    assert {"report.yaml", "report.html", "graph.graphml"} <= {p.name for p in merged.iterdir()}


def _refused(results: Path, capsys, *extra) -> str:
    capsys.readouterr()
    assert main(["merge", str(results), *extra, "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _copy(trip, tmp_path: Path, edit) -> Path:
    """The results file, edited, beside a copy of nothing else (merge finds the bundle with --bundle)."""
    lines = trip["results"].read_bytes().splitlines(keepends=True)
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(edit(lines)))
    return path


def test_corrupted_tampered_foreign_and_truncated_results_are_refused(trip, tmp_path, capsys):
    bundle = ["--bundle", str(trip["bundle"])]
    corrupted = _copy(trip, tmp_path, lambda ls: [*ls[:5], b"{not json\n", *ls[5:]])
    assert "corrupted" in _refused(corrupted, capsys, *bundle)

    def tamper(lines):
        i = next(i for i, raw in enumerate(lines) if b'"status":"ran"' in raw)
        return [*lines[:i], lines[i].replace(b'"status":"ran"', b'"status":"crash"'), *lines[i + 1:]]

    assert "tampered" in _refused(_copy(trip, tmp_path, tamper), capsys, *bundle)
    truncated = _copy(trip, tmp_path, lambda ls: ls[:-1])
    assert "truncated" in _refused(truncated, capsys, *bundle)
    torn = _copy(trip, tmp_path, lambda ls: [*ls[:-1], ls[-1][:30]])
    assert "truncated" in _refused(torn, capsys, *bundle)
    other = tmp_path / "other"
    shutil.copytree(trip["bundle"], other, ignore=shutil.ignore_patterns("results"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["repro_timeout"] = 7  # another bundle: another manifest, another hash, the same files
    from opscan.bundle.results import bundle_hash

    manifest["bundle_hash"] = bundle_hash(manifest)
    (other / "manifest.json").write_text(json.dumps(manifest))
    err = _refused(trip["results"], capsys, "--bundle", str(other))
    assert "foreign" in err and "--bundle" in err


def test_a_forged_digest_passes_and_merge_says_what_the_digest_proves(trip, tmp_path, capsys):
    """The digest is a checksum, not a signature: an outcome edited and the end line's digest recomputed is
    merged (docs/bundle.md), and merge's line says the digest rules out corruption and careless
    edits, not a deliberate forgery."""
    from opscan.bundle.results import digest

    def forge(lines):
        i = next(i for i, raw in enumerate(lines) if b'"status":"ran"' in raw)
        body = [*lines[:i], lines[i].replace(b'"status":"ran"', b'"status":"crash"'), *lines[i + 1:-1]]
        end = json.loads(lines[-1])
        end["digest"] = digest(b"".join(body))
        return [*body, (json.dumps(end, separators=(",", ":")) + "\n").encode()]

    forged = _copy(trip, tmp_path, forge)
    capsys.readouterr()
    assert main(["merge", str(forged), "--bundle", str(trip["bundle"]), "-o", str(tmp_path / "merged")]) == 0
    err = capsys.readouterr().err
    assert "results intact" in err and "not a deliberate forgery (anyone can recompute it)" in err
    assert "crash" in (tmp_path / "merged" / "report.json").read_text()  # the forged outcome made it in


def _scan_options_edited(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["scan"]["inference"] = True
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _appended(rel: str):
    def edit(folder: Path) -> None:
        with open(folder / rel, "a") as f:
            f.write("\n# edited\n")
    return edit


@pytest.mark.parametrize(("edit", "says"), [
    (_appended("probes.jsonl"), "probes.jsonl differs from the bundle's manifest"),
    (_appended("run.sh"), "run.sh differs from the bundle's manifest"),
    (_appended("README.txt"), "README.txt differs from the bundle's manifest"),
    (_appended("repro/aten_take/repro_1.py"), "repro/aten_take/repro_1.py differs from the bundle's manifest"),
    (_scan_options_edited, "manifest.json does not match its bundle_hash"),
], ids=["probes", "run.sh", "README", "repro-script", "manifest-scan-options"])
def test_a_modified_bundle_is_refused_on_the_mac_and_by_merge(trip, tmp_path, capsys, edit, says):
    copy = tmp_path / "copy"
    shutil.copytree(trip["bundle"], copy, ignore=shutil.ignore_patterns("results"))
    _add_repro_script(copy)
    shutil.copytree(copy, tmp_path / "intact")
    edit(copy)
    for folder, refused in ((tmp_path / "intact", False), (copy, True)):
        proc = subprocess.run([sys.executable, "-m", "opscan.bundle.remote", str(folder), "--check"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(folder / "src")})
        assert (proc.returncode, says in proc.stderr) == ((2, True) if refused else (0, False)), proc.stderr
    assert proc.stderr.count("\n") == 1 and "unpack the bundle again" in proc.stderr
    err = _refused(trip["results"], capsys, "--bundle", str(copy))
    assert "modified after it was made" in err and says in err


def _add_repro_script(folder: Path) -> None:
    """A repro script listed like make.py lists them (custom_step predicts no finding), the hash made anew."""
    from opscan.bundle.results import bundle_hash, digest

    script = folder / "repro/aten_take/repro_1.py"
    script.parent.mkdir(parents=True)
    script.write_text("print('repro')\n")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["repro/aten_take/repro_1.py"] = digest(script.read_bytes())
    manifest["repro"] = [{"script": "repro/aten_take/repro_1.py", "probe": "p1"}]
    manifest["bundle_hash"] = bundle_hash(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_bundle_for_a_device_this_machine_lacks_is_refused_before_any_result(trip, tmp_path):
    """run.sh's first Python call checks the device: nothing is recorded, collect_env does not run."""
    copy = tmp_path / "copy"
    shutil.copytree(trip["bundle"], copy, ignore=shutil.ignore_patterns("results"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["device"] = "mps"  # a consistent bundle for mps: its own hash
    from opscan.bundle.results import bundle_hash

    manifest["bundle_hash"] = bundle_hash(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bash", str(copy / "run.sh")], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, "PYTHON": sys.executable})  # collect_env not skipped: it must not start
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "this bundle probes on mps, which torch" in proc.stderr and "run it on a Mac" in proc.stderr
    assert not (copy / "results").exists()  # no results/env, no log, no results file
