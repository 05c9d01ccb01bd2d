"""Data from somewhere else (issues 27 and 36): a bundle folder copied back from a Mac, a colleague's report, a zoo
manifest, the names inside a user's model, a shared output folder — through `python -m opscan` as a user meets
them, every promise of the hostile suite checked (helpers_hostile.check: exit code, one line, no traceback, stdout
whole or empty, nothing partial, no process left). Each test is named after the issue's item it proves
(`test_item_NN_...` for issue 27, `test_r4_...` for issue 36's round 4; its unit tests: test_trust_round4.py). The
runs are independent and start together (helpers_hostile.run_all), after one bundle run on the CPU standing in for
a Mac.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from conftest import TARGETS
from helpers_hostile import TINY, check, opscan, run_all

TRUST = TARGETS / "trust.py"
LOADER = f"{TARGETS / 'loader_workers.py'}:build_model"
PAIR = f"{TARGETS / 'baseline_pair.py'}:build_model"
MLP = f"{TARGETS / 'zoo_tiny.py'}:mlp"
FAST = ["--no-memory", "--no-fx"]
DEEP_JSON = "[" * 100_000 + "]" * 100_000  # a RecursionError (exit 3) in eight readers before
DEEP_YAML = "models: " + "[" * 100_000 + "]" * 100_000 + "\n"
BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB  # 10^9 values once expanded, 600 bytes written
NOT_UTF8 = b"models:\n  \xff\xfe: {target: x.py:f}\n"


def trust(factory: str) -> str:
    return f"{TRUST}:{factory}"


# --- the bundle every merge case starts from -----------------------------------------------------------------


def _run_sh(bundle: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTORCH_ENABLE_MPS_FALLBACK")}
    env.update(PYTHON=sys.executable, OPSCAN_SKIP_COLLECT_ENV="1")
    done = subprocess.run(["bash", str(bundle / "run.sh")], cwd="/", env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """TINY bundled for the CPU here (its record is in this session's store) and run by its run.sh."""
    folder = tmp_path_factory.mktemp("made") / "b"
    check(opscan("bundle", TINY, "--device", "cpu", "--workers", "1", "-o", str(folder), "--no-fx"), 0)
    _run_sh(folder)
    return folder


def _edited(bundle: Path, edit, results_edit=None):
    """setup: a copy of the bundle (results included) whose manifest `edit` changed and whose bundle_hash was
    recomputed, with the results' header and end digest made to match it — what someone holding the folder can
    do without opscan's help."""
    from opscan.bundle.results import bundle_hash, digest

    def setup(folder: Path) -> None:
        copy = folder / "b"
        shutil.copytree(bundle, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        edit(manifest, folder)
        manifest["bundle_hash"] = bundle_hash(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
        lines = (copy / "results" / "results.jsonl").read_bytes().splitlines(keepends=True)
        header = json.loads(lines[0])
        header["bundle"] = manifest["bundle_hash"]
        body = [(json.dumps(header, separators=(",", ":")) + "\n").encode(), *lines[1:-1]]
        body = results_edit(body) if results_edit else body
        end = json.loads(lines[-1])
        end["digest"] = digest(b"".join(body))
        (copy / "results" / "results.jsonl").write_bytes(b"".join([*body, (json.dumps(end) + "\n").encode()]))
    return setup


EVIL = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('imported')\n\ndef build_model():\n    pass\n"


def _evil_target(manifest: dict, folder: Path) -> None:
    (folder / "evil.py").write_text(EVIL)
    manifest["target"] = manifest["scan"]["target"] = f"{folder / 'evil.py'}:build_model"


def _os_system(manifest: dict, folder: Path) -> None:
    manifest["scan"]["target"] = "os:system"
    manifest["scan"]["args"] = {"command": repr(f"touch {folder / 'RAN'}")}


def _another_machine(manifest: dict, folder: Path) -> None:
    _evil_target(manifest, folder)
    manifest["fingerprint"] = "0" * 16  # no bundle made here has this plan: nothing to compare with


def _outside(manifest: dict, folder: Path) -> None:
    manifest["files"]["../../../../../../etc/hostname"] = "0" * 64


def _deep_line(body: list[bytes]) -> list[bytes]:
    return [*body[:2], (DEEP_JSON + "\n").encode(), *body[2:]]


def _escape_outcome(body: list[bytes]) -> list[bytes]:
    """An exception text that came back from the Mac with terminal escape sequences in it: the first probe that
    ran raised instead, in both passes (the on pass runs for a probe that raised)."""
    out, done = [], False
    for raw in body:
        entry = json.loads(raw)
        if not done and entry.get("kind") == "outcome" and entry.get("status") == "ran":
            entry.update(status="raised", exc_type="RuntimeError", message="\x1b[2J\x1b]0;pwned\x07 kernel failed")
            again = {**entry, "pass_name": "on"}
            out += [(json.dumps(e, separators=(",", ":")) + "\n").encode() for e in (entry, again)]
            done = True
            continue
        out.append(raw)
    return out


def _merge(*extra):
    return ["merge", "{dir}/b/results/results.jsonl", "-o", "{dir}/out", *extra]


# --- zoo setups -----------------------------------------------------------------------------------------------


def _write(name: str, content: str | bytes):
    def setup(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def _journal(line: bytes):
    """setup: a one-model manifest and a journal (of the same releases) whose second line is `line`."""
    def setup(folder: Path) -> None:
        (folder / "zoo.yaml").write_text(f"models:\n  mlp:\n    target: {MLP}\n")
        (folder / "out").mkdir()
        header = {"kind": "header", "journal": 1, "title": "zoo", "releases": ["2.14.1"]}
        (folder / "out" / "zoo.jsonl").write_bytes(json.dumps(header).encode() + b"\n" + line + b"\n")
    return setup


CRAFTED_NAMES = {"=HYPERLINK(\"http://evil\",\"x\")": MLP, "<!--<script>alert(1)</script>": MLP, "@SUM(1)": MLP}


def _crafted_zoo(folder: Path) -> None:
    (folder / "zoo.yaml").write_text(yaml.safe_dump({"models": {n: {"target": t} for n, t in CRAFTED_NAMES.items()}}))


def _scanned_with_take(folder: Path) -> None:
    check(opscan(PAIR, "--arg", "take=True", "--repro", "-o", str(folder / "out"), *FAST), 0)
    assert (folder / "out" / "repro" / "aten_take" / "repro_1.py").is_file()  # take: for the tracker, no ISSUE.md


def _crafted_report(folder: Path) -> None:
    _scanned_with_take(folder)
    report = json.loads((folder / "out" / "report.json").read_text())
    report["opscan_version"] = "0.1.0 --> <script>alert(1)</script> <!-- "
    (folder / "crafted.json").write_text(json.dumps(report))


# --- issue 36 (round 4) setups -------------------------------------------------------------------------------

ROUND4 = TARGETS / "round4.py"
LONG_INT = "9" * 5000  # longer than int() converts (sys.get_int_max_str_digits: 4300)


def _linked_repro(folder: Path) -> None:
    """out/repro is a link to a folder outside, holding a file of someone else's where a stale ISSUE.md would be."""
    (folder / "outside" / "aten_take").mkdir(parents=True)
    (folder / "outside" / "aten_take" / "ISSUE.md").write_text("someone else's")
    (folder / "out").mkdir()
    (folder / "out" / "repro").symlink_to(folder / "outside")


def _outcome_edit(**fields):
    """results_edit: the first outcome line that ran, with `fields` set (what a forged results file can hold)."""
    def edit(body: list[bytes]) -> list[bytes]:
        out, done = [], False
        for raw in body:
            entry = json.loads(raw)
            if not done and entry.get("kind") == "outcome" and entry.get("status") == "ran":
                entry.update(fields)
                raw, done = (json.dumps(entry, separators=(",", ":")) + "\n").encode(), True
            out.append(raw)
        return out
    return edit


def _raw_outcome_edit(old: bytes, new: bytes):
    """results_edit replacing bytes in the first outcome line that holds `old` (NaN and 1e999 are no JSON dumps)."""
    def edit(body: list[bytes]) -> list[bytes]:
        index = next(i for i, raw in enumerate(body) if b'"kind":"outcome"' in raw and old in raw)
        return [*body[:index], body[index].replace(old, new, 1), *body[index + 1:]]
    return edit


def _compared(body: list[bytes]) -> list[bytes]:
    """The first outcome that ran gets a comparison whose max_abs is a placeholder (replaced as raw bytes)."""
    comparison = {"how": "elementwise", "within": False, "max_abs": 12345.5, "max_rel": 1.0,
                  "reference": "float64", "detail": None}
    return _outcome_edit(comparison=comparison)(body)


def _forged_comparison(value: bytes):
    return lambda body: _raw_outcome_edit(b'"max_abs":12345.5', b'"max_abs":' + value)(_compared(body))


def _linked_project(folder: Path) -> None:
    """A project (.git) whose models/ folder is a link to a folder outside it: a layer defined beside the model."""
    outside = folder.parent / f"{folder.name}-elsewhere"
    (outside / "models").mkdir(parents=True)
    (outside / "models" / "helper.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Take(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.register_buffer('index', torch.tensor([3, 2, 1, 0]))\n\n"
        "    def forward(self, y):\n        return torch.take(y, self.index)\n")
    (outside / "models" / "net.py").write_text(
        "import torch\nfrom torch import nn\nfrom helper import Take\n\n\ndef build_model():\n"
        "    return nn.Sequential(nn.Linear(4, 4), Take()), torch.randn(2, 4)\n")
    (folder / ".git").mkdir()
    (folder / "models").symlink_to(outside / "models")


def _newline_target(folder: Path) -> None:
    """The target's file in a folder whose name holds a line break and a workflow command."""
    forged = folder / "x\n::error file=forged.py::target path"
    forged.mkdir()
    shutil.copy(ROUND4, forged / "round4.py")


def _round4(bundle: Path, zoo: list[str]) -> dict:
    r4 = f"{ROUND4}:"
    return {
        # high 2: a linked repro/ in -o — written into, or removed through
        "r4_linked_repro": {"argv": [PAIR, "--arg", "take=True", "--repro", "-o", "{dir}/out", *FAST],
                            "setup": _linked_repro},
        "r4_linked_repro_rescan": {"argv": [PAIR, "-o", "{dir}/out", *FAST], "setup": _linked_repro},
        # high 3: a credential passed with --arg
        "r4_secret_arg": {"argv": [r4 + "secret", "--arg", "token=ghp_SECRET123", "--arg", "take=True",
                                   "--public-arg", "take", "--repro", "-o", "{dir}/out", *FAST]},
        # values the reader let through
        "r4_long_int_repro": {"argv": ["repro", "{dir}/r.json", "aten::take"],
                              "setup": _write("r.json", '{"schema_version": 3, "model": ' + LONG_INT + "}")},
        "r4_long_int_baseline": {"argv": [TINY, "--baseline", "{dir}/r.json", "-o", "{dir}/out", *FAST],
                                 "setup": _write("r.json", '{"ops": [{"calls": ' + LONG_INT + "}]}")},
        "r4_long_int_in_output": {"argv": [TINY, "-o", "{dir}/out", *FAST],
                                  "setup": _write("out/report.json", '{"model": ' + LONG_INT + "}")},
        "r4_date_zoo_manifest": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                                 "setup": _write("zoo.yaml", f"models:\n  mlp:\n    target: {MLP}\n"
                                                             "    added: 2023-02-30\n")},
        "r4_date_accept_spec": {"argv": ["accept", TINY, "--device", "cpu", "--spec", "{dir}/spec.yaml", "-o",
                                         "{dir}/o"], "setup": _write("spec.yaml", "seed: 2023-02-30\n")},
        # what a Mac sends back: wrong types, numbers that are not JSON
        "r4_results_message_list": {"argv": _merge("-f", "json"),
                                    "setup": _edited(bundle, lambda m, f: None, _outcome_edit(message=["a", "b"]))},
        "r4_results_duration_text": {"argv": _merge("-f", "json"),
                                     "setup": _edited(bundle, lambda m, f: None, _outcome_edit(duration="slow"))},
        "r4_results_nan": {"argv": _merge("-f", "json"),
                           "setup": _edited(bundle, lambda m, f: None, _forged_comparison(b"NaN"))},
        "r4_results_overflow": {"argv": _merge("-f", "json"),
                                "setup": _edited(bundle, lambda m, f: None, _forged_comparison(b"1e999"))},
        "r4_results_platform": {"argv": _merge("-v"), "setup": _edited(bundle, lambda m, f: None, _platform)},
        # workflow commands forged through the table and stderr
        "r4_forged_table": {"argv": [r4 + "forged", "-o", "{dir}/out", "--no-fx"]},
        "r4_forged_target": {"argv": ["{dir}/x\n::error file=forged.py::target path/round4.py:forged", "-v", "-o",
                                      "{dir}/out", "--no-fx"], "setup": _newline_target},
        # a model name over 255 bytes, the default output folder
        "r4_wide_name": {"argv": [r4 + "model", *FAST], "cwd": True},
        # SARIF for a model folder that is a link inside the repository
        "r4_linked_project": {"argv": ["models/net.py:build_model", "-f", "sarif", "-o", "{dir}/out", *FAST],
                              "cwd": True, "setup": _linked_project},
    }


def _platform(body: list[bytes]) -> list[bytes]:
    """The off pass's environment record says its platform is a line break and a workflow command."""
    out = []
    for raw in body:
        entry = json.loads(raw)
        if entry.get("kind") == "environment" and isinstance(entry.get("environment"), dict):
            entry["environment"]["platform"] = "macOS\n::error file=x.py::forged by the Mac"
            raw = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        out.append(raw)
    return out


@pytest.fixture(scope="module")
def ran(bundle, tmp_path_factory):
    """Every case, run at once: name -> (Run, the case's folder)."""
    zoo = ["--releases", "2.14.1", "--workers", "1", "-q"]
    cases = {
        # item 1: bundles whose target cannot be swapped
        "bundle_target_swapped": {"argv": _merge(), "setup": _edited(bundle, _evil_target)},
        "bundle_os_system": {"argv": _merge(), "setup": _edited(bundle, _os_system)},
        "bundle_from_elsewhere": {"argv": _merge(), "setup": _edited(bundle, _another_machine)},
        "bundle_device_changed": {"argv": _merge(), "setup": _edited(bundle, lambda m, f: m.update(device="cuda"))},
        "bundle_lists_outside": {"argv": _merge(), "setup": _edited(bundle, _outside)},
        "bundle_intact": {"argv": _merge("-f", "json"), "setup": lambda f: shutil.copytree(bundle, f / "b")},
        "bundle_mac_escapes": {"argv": _merge(), "setup": _edited(bundle, lambda m, f: None, _escape_outcome)},
        # item 2: names that are paths
        "name_dotdot": {"argv": [trust("build"), *FAST], "cwd": True},
        "name_dotdot_bundle": {"argv": ["bundle", trust("build"), "--device", "cpu", "--no-fx"], "cwd": True},
        "name_slashed": {"argv": [trust("model"), *FAST], "cwd": True},
        # item 3: alias bombs
        "zoo_alias_bomb": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                           "setup": _write("zoo.yaml", BOMB + f"models:\n  m:\n    target: {MLP}\n    args: *i\n")},
        "spec_alias_bomb": {"argv": ["accept", TINY, "--device", "cpu", "--spec", "{dir}/spec.yaml", "-o", "{dir}/o"],
                            "setup": _write("spec.yaml", BOMB + "seed: *i\n")},
        # items 4 and 5: escape sequences and control characters in module names
        "escapes_table": {"argv": [trust("escapes"), "-v", "-o", "{dir}/out", *FAST]},
        "escapes_junit": {"argv": [trust("escapes"), "-f", "junit", "-o", "{dir}/out", "--no-memory"]},
        # items 6 and 7: the zoo page and its CSV
        "zoo_crafted_names": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo], "setup": _crafted_zoo},
        # item 8: ISSUE.md's header comment
        "issue_comment": {"argv": ["repro", "{dir}/crafted.json", "aten::take", "--draft", "-o", "{dir}/again"],
                          "setup": _crafted_report},
        # item 9: nested very deeply, in eight readers
        "deep_repro_report": {"argv": ["repro", "{dir}/deep.json", "aten::take"], "setup": _write("deep.json", DEEP_JSON)},
        "deep_baseline": {"argv": [TINY, "--baseline", "{dir}/deep.json", "-o", "{dir}/out", *FAST],
                          "setup": _write("deep.json", DEEP_JSON)},
        "deep_zoo_diff": {"argv": ["zoo", "diff", "{dir}/deep.json", "{dir}/deep.json"],
                          "setup": _write("deep.json", DEEP_JSON)},
        "deep_accept_report": {"argv": ["accept", TINY, "--device", "cpu", "--report", "{dir}/deep.json", "-o",
                                        "{dir}/o"], "setup": _write("deep.json", DEEP_JSON)},
        "deep_merge_results": {"argv": _merge(), "setup": _edited(bundle, lambda m, f: None, _deep_line)},
        "deep_zoo_journal": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                             "setup": _journal(DEEP_JSON.encode())},
        "deep_zoo_manifest": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                              "setup": _write("zoo.yaml", DEEP_YAML)},
        "deep_accept_spec": {"argv": ["accept", TINY, "--device", "cpu", "--spec", "{dir}/spec.yaml", "-o", "{dir}/o"],
                             "setup": _write("spec.yaml", "seed: " + "[" * 100_000 + "]" * 100_000 + "\n")},
        # item 10: not UTF-8
        "latin_zoo_manifest": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                               "setup": _write("zoo.yaml", NOT_UTF8)},
        "latin_accept_spec": {"argv": ["accept", TINY, "--device", "cpu", "--spec", "{dir}/spec.yaml", "-o", "{dir}/o"],
                              "setup": _write("spec.yaml", b"seed: 1 # \xe9t\xe9\n")},
        # item 11: damaged zoo journal lines
        "journal_no_key": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                           "setup": _journal(b'{"kind": "model", "result": {}}')},
        "journal_a_list": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo], "setup": _journal(b"[1, 2]")},
        "journal_bad_result": {"argv": ["zoo", "{dir}/zoo.yaml", "-o", "{dir}/out", *zoo],
                               "setup": _journal(b'{"kind": "model", "key": "mlp#0", "result": {"model": {"name": '
                                                 b'"mlp", "target": "x.py:f"}, "cells": [{"release": 5}], '
                                                 b'"seconds": 1}}')},
        # item 12: an ASCII-only stdout
        "ascii_table": {"argv": [TINY, "-o", "{dir}/out", *FAST], "env": {"PYTHONIOENCODING": "ascii"}},
        "ascii_c_locale": {"argv": [TINY, "-o", "{dir}/out", *FAST], "env": {"LC_ALL": "C", "PYTHONUTF8": "0"}},
        "ascii_yaml": {"argv": [TINY, "-f", "yaml", "-o", "{dir}/out", *FAST], "env": {"PYTHONIOENCODING": "ascii"}},
        "ascii_junit": {"argv": [PAIR, "--arg", "take=True", "-f", "junit", "-o", "{dir}/out", *FAST],
                        "env": {"PYTHONIOENCODING": "ascii"}},
        # item 13: a rescan with another --arg
        "rescan_repro": {"argv": [PAIR, "--arg", "take=False", "--repro", "-o", "{dir}/out", *FAST],
                         "setup": _scanned_with_take},
        # item 14: DataLoader workers in the step
        "loader_workers": {"argv": [LOADER, "-f", "json", "-o", "{dir}/out", "--no-fx"]},
        "loader_workers_fake": {"argv": [LOADER, "--fake", "-f", "json", "-o", "{dir}/out", "--no-fx"]},
        # item 15: custom ops the target registers
        "custom_ops": {"argv": [trust("custom_ops"), "-f", "json", "-o", "{dir}/out", *FAST]},
    }
    cases.update(_round4(bundle, zoo))
    return run_all(cases, tmp_path_factory.mktemp("trust"))


# --- item 1 ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("bundle_target_swapped", ("was changed after the bundle was made here", "scan.target: was", "evil.py")),
    ("bundle_os_system", ("was changed after the bundle was made here", "scan.args.command", "scan.target",
                          "'os:system'")),
    ("bundle_device_changed", ("was changed after the bundle was made here", "device: was 'cpu', is now 'cuda'")),
    ("bundle_from_elsewhere", ("was not made on this machine", "no record of bundle", "make the bundle again")),
])
def test_item_01_an_edited_bundle_runs_no_code_on_the_merging_machine(ran, name, says):
    run, folder = ran[name]
    check(run, 2, says)
    assert not (folder / "RAN").exists(), "merge imported or ran what the received folder named"
    assert "tracing" not in run.err and not (folder / "out").exists()


def test_item_01_a_manifest_listing_a_file_outside_the_bundle_is_refused(ran):
    run, folder = ran["bundle_lists_outside"]
    check(run, 2, ("was modified after it was made", "not a file inside the bundle"))


def test_item_01_the_bundle_made_here_still_merges(ran):
    run, folder = ran["bundle_intact"]
    check(run, 0, "wrote", fmt="json", folders=[folder / "out"])
    measurement = json.loads(run.out)["measurement"]  # the CPU stands in for the Mac: measured there, not MPS
    assert "results intact" in run.err and (measurement["journal"], measurement["device"]) == ("results.jsonl", "cpu")


# --- item 2 ---------------------------------------------------------------------------------------------------


def test_item_02_a_model_class_named_dotdot_writes_inside_reports(ran):
    run, folder = ran["name_dotdot"]
    check(run, 0, folders=[folder / "reports"])
    assert sorted(p.name for p in folder.iterdir()) == ["reports"]  # no ./report.html, ./report.yaml beside it
    (made,) = (folder / "reports").iterdir()
    assert made.name == "_." and (made / "report.json").is_file()


def test_item_02_bundle_of_a_model_class_named_dotdot_stays_in_bundles(ran):
    run, folder = ran["name_dotdot_bundle"]
    check(run, 0, "wrote the bundle")
    assert sorted(p.name for p in folder.iterdir()) == ["bundles"]
    assert sorted(p.name for p in (folder / "bundles").iterdir()) == ["_.", "_..zip"]
    assert run.out.splitlines() == [str(Path("bundles") / "_."), str(Path("bundles") / "_..zip")]


def test_item_02_a_class_named_like_a_path_is_one_folder(ran):
    run, folder = ran["name_slashed"]
    check(run, 0)
    assert [p.name for p in (folder / "reports").iterdir()] == ["_._.._etc_x_"]  # `.` first, `/` and ESC: `_`


# --- item 3 ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, what", [("zoo_alias_bomb", "the manifest"), ("spec_alias_bomb", "spec")])
def test_item_03_a_yaml_alias_bomb_is_refused_up_front(ran, name, what):
    run, folder = ran[name]
    check(run, 2, (what, "alias bomb", "2000000 values"))
    assert not (folder / "out").exists() and not (folder / "o").exists()  # no leaderboard, no journal


# --- items 4 and 5 --------------------------------------------------------------------------------------------


def test_item_04_terminal_escapes_in_module_names_are_printed_escaped(ran):
    run, _ = ran["escapes_table"]
    check(run, 0)
    assert "\x1b" not in run.out and "\x1b" not in run.err and "\x07" not in run.out + run.err
    # visible, both halves: the module column folds the name where its width ends (the `where` column took some)
    assert "\\x1b[2J\\x1b]0;pwned\\" in run.out and "x07mod\\x01x" in run.out, run.out


def test_item_04_exception_texts_from_a_mac_are_printed_escaped(ran):
    run, _ = ran["bundle_mac_escapes"]
    check(run, 0)
    assert "\x1b" not in run.out + run.err and "\x07" not in run.out + run.err
    assert "\\x1b[2J\\x1b]0;pwned\\x07 kernel failed" in run.out + run.err


def test_item_05_control_characters_in_module_names_keep_the_xml_well_formed(ran):
    import networkx as nx

    run, folder = ran["escapes_junit"]
    check(run, 0, fmt="junit", folders=[folder / "out"])
    for name in ("graph.graphml", "modules.graphml"):
        ET.parse(folder / "out" / name)
        graph = nx.read_graphml(folder / "out" / name)
        assert any("\\x1b[2J" in str(d.get("module", "")) or "\\x1b[2J" in str(n) for n, d in graph.nodes(data=True))


# --- items 6 and 7 --------------------------------------------------------------------------------------------


def test_item_06_the_zoo_page_escapes_its_json_block(ran):
    run, folder = ran["zoo_crafted_names"]
    check(run, 0, folders=[folder / "out"])
    page = (folder / "out" / "leaderboard.html").read_text()
    block = page.split('<script type="application/json" id="zoo-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block and ">" not in block and "&" not in block
    data = json.loads(block)
    assert "<!--<script>alert(1)</script>@2.14.1" in data["cells"]  # the names survive, escaped
    assert page.count("<script") == 2 and "<!--" not in page  # the page's two scripts, nothing opened by a name


def test_item_07_leaderboard_csv_neutralises_formula_names(ran):
    import csv

    run, folder = ran["zoo_crafted_names"]
    rows = list(csv.DictReader((folder / "out" / "leaderboard.csv").open()))
    assert {r["model"] for r in rows} == {"'=HYPERLINK(\"http://evil\",\"x\")", "<!--<script>alert(1)</script>",
                                          "'@SUM(1)"}
    assert not any(cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())


# --- item 8 ---------------------------------------------------------------------------------------------------


def test_item_08_a_crafted_opscan_version_cannot_end_issue_md_s_comment(ran):
    run, folder = ran["issue_comment"]
    check(run, 0)
    text = (folder / "again" / "repro" / "aten_take" / "ISSUE.md").read_text()
    first = text.splitlines()[0]
    assert first.startswith("<!-- Generated by opscan 0.1.0 ") and first.endswith("-->")
    assert first.count("-->") == 1 and first.count("<!--") == 1 and "<script>" in first  # inert inside the comment


# --- item 9 ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("deep_repro_report", ("the report", "deep.json", "nested deeper than 64 levels")),
    ("deep_baseline", ("the baseline", "deep.json", "nested deeper than 64 levels")),
    ("deep_zoo_diff", ("the leaderboard", "deep.json", "nested deeper than 64 levels")),
    ("deep_accept_report", ("--report", "deep.json", "nested deeper than 64 levels")),
    ("deep_merge_results", ("corrupted results file", "line 3 is not a JSON record")),
    ("deep_zoo_journal", ("zoo journal", "line 2: not JSON (nested deeper than 64 levels)")),
    ("deep_zoo_manifest", ("the manifest", "zoo.yaml", "nested deeper than 64 levels")),
    ("deep_accept_spec", ("spec", "spec.yaml", "nested deeper than 64 levels")),
])
def test_item_09_deeply_nested_files_are_exit_2_in_every_reader(ran, name, says):
    run, _ = ran[name]
    check(run, 2, says)
    assert "RecursionError" not in run.err


# --- item 10 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("latin_zoo_manifest", ("the manifest", "zoo.yaml", "is not UTF-8 text (byte 10")),
    ("latin_accept_spec", ("spec", "spec.yaml", "is not UTF-8 text (byte 10")),
])
def test_item_10_files_that_are_not_utf8_are_exit_2(ran, name, says):
    run, folder = ran[name]
    check(run, 2, says)
    assert not (folder / "out").exists() and not (folder / "o").exists()


# --- item 11 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, why", [
    ("journal_no_key", "a model line without its key"),
    ("journal_a_list", "a JSON list, not a record"),
    ("journal_bad_result", "not a model result"),
])
def test_item_11_a_damaged_zoo_journal_line_is_exit_2_naming_it(ran, name, why):
    """Issue 36 changed issue 27's answer: a damaged line was skipped (exit 0), which accepted an edited journal;
    now it is exit 2 naming the line and why, before any model is scanned, as the probe journal's."""
    run, folder = ran[name]
    check(run, 2, ("zoo journal", "zoo.jsonl, line 2: " + why, "delete that line"), folders=[folder / "out"])
    assert not (folder / "out" / "leaderboard.json").exists()


# --- item 12 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ascii_table", "ascii_c_locale"])
def test_item_12_an_ascii_only_stdout_gets_the_table_in_ascii(ran, name):
    run, _ = ran[name]
    check(run, 0)
    assert run.out.isascii() and "Summary: native" in run.out and " - " in run.out


def test_item_12_yaml_and_junit_degrade_to_ascii_that_means_the_same(ran):
    run, folder = ran["ascii_yaml"]
    check(run, 0, fmt="yaml")
    assert run.out.isascii()
    assert yaml.safe_load(run.out) == yaml.safe_load((folder / "out" / "report.yaml").read_text(encoding="utf-8"))
    run, folder = ran["ascii_junit"]
    check(run, 0, fmt="junit")
    cases = [c.get("name") for c in ET.fromstring(run.out).iter("testcase")]
    assert run.out.isascii() and any(name.startswith("aten::take [") for name in cases), cases


# --- item 13 --------------------------------------------------------------------------------------------------


def test_item_13_a_rescan_leaves_repro_holding_only_its_own_findings(ran):
    run, folder = ran["rescan_repro"]
    check(run, 0, folders=[folder / "out"])
    report = json.loads((folder / "out" / "report.json").read_text())
    assert report["repro"]["findings"] == [] and not (folder / "out" / "repro").exists()


# --- item 14 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["loader_workers", "loader_workers_fake"])
def test_item_14_a_dataloader_with_workers_sizes_without_tracebacks(ran, name):
    run, _ = ran[name]
    check(run, 0, fmt="json")  # no Traceback on stderr: no worker died
    scaling = json.loads(run.out)["memory"]["batch_scaling"]
    assert scaling["method"] in ("meta", "fake") and len(scaling["points"]) == 2, scaling
    assert "exited unexpectedly" not in run.err


# --- item 15 --------------------------------------------------------------------------------------------------


def test_item_15_custom_ops_the_target_registers_are_decided_from_their_registrations(ran):
    run, _ = ran["custom_ops"]
    check(run, 0, fmt="json")
    rows = {r["op"]: r for r in json.loads(run.out)["ops"]}
    cpu_only = rows["trustlab::cpu_only"]
    assert (cpu_only["verdict"], cpu_only["evidence"]["rule"]) == ("unsupported", "target-registration-no-mps")
    assert "has kernels for CPU" in cpu_only["evidence"]["text"] and "trust.py" in cpu_only["evidence"]["text"]
    assert (rows["trustlab::with_mps"]["verdict"], rows["trustlab::with_mps"]["evidence"]["rule"]) == \
        ("native", "target-registration-mps")
    assert rows["torchvision::nms"]["evidence"]["rule"].startswith("torchvision-")  # a compiled extension: the table


# --- issue 36 (round 4) ---------------------------------------------------------------------------------------


def test_r4_high_2_a_linked_repro_folder_is_refused_and_nothing_written_through_it(ran):
    run, folder = ran["r4_linked_repro"]
    check(run, 2, ("repro is a symbolic link", "opscan never writes or removes through a link", "remove"))
    assert [p.name for p in (folder / "outside").rglob("*")] == ["aten_take", "ISSUE.md"]
    assert (folder / "outside" / "aten_take" / "ISSUE.md").read_text() == "someone else's"


def test_r4_high_2_stale_repro_removal_never_follows_a_link(ran):
    run, folder = ran["r4_linked_repro_rescan"]
    check(run, 0, folders=[folder / "out"])
    assert (folder / "outside" / "aten_take" / "ISSUE.md").read_text() == "someone else's"


def test_r4_high_3_a_credential_passed_with_arg_reaches_no_file(ran):
    run, folder = ran["r4_secret_arg"]
    check(run, 0, folders=[folder / "out"])
    files = [p for p in (folder / "out").rglob("*") if p.is_file()]
    assert not [p.name for p in files if "ghp_SECRET123" in p.read_text(errors="replace")]
    # the command an ISSUE.md would show (take's cause is the missing-ops tracker's: no ISSUE.md is written for it)
    command = json.loads((folder / "out" / "report.json").read_text())["repro"]["command"]
    assert "--arg 'token=<redacted>' --arg take=True --public-arg take" in command  # the public one keeps its value


@pytest.mark.parametrize("name, says", [
    ("r4_long_int_repro", ("the report", "r.json", "model: an integer of 5000 digits")),
    ("r4_long_int_baseline", ("the baseline", "r.json", r"ops[0].calls: an integer of 5000 digits")),
    ("r4_long_int_in_output", ("holds the results of another target", "a report.json opscan cannot read")),
    ("r4_date_zoo_manifest", ("the manifest", "zoo.yaml", "models.mlp.added (line 4, column 12)",
                              "'2023-02-30' is not a date", "day is out of range for month")),
    ("r4_date_accept_spec", ("spec", "spec.yaml", "seed (line 1, column 7)", "is not a date")),
])
def test_r4_values_the_reader_let_through_are_exit_2_naming_the_file_and_field(ran, name, says):
    run, folder = ran[name]
    check(run, 2, says)
    assert "ValueError" not in run.err and not (folder / "o").exists()


@pytest.mark.parametrize("name, says", [
    ("r4_results_message_list", "field 'message' is a list, not text or null"),
    ("r4_results_duration_text", "field 'duration' is text, not an integer or a number"),
    ("r4_results_nan", "comparison.max_abs: NaN is not a JSON number"),
    ("r4_results_overflow", "comparison.max_abs: a number too large for a float (inf)"),
])
def test_r4_results_fields_of_the_wrong_type_are_exit_2_naming_the_field(ran, name, says):
    run, folder = ran[name]
    check(run, 2, ("corrupted results file", says))
    assert not (folder / "out").exists()  # no report.json with NaN in it, nothing half-merged


def _starts_a_command(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip(" \t").startswith("::")]


def test_r4_a_mac_cannot_forge_a_workflow_command_through_merges_log_line(ran):
    run, _ = ran["r4_results_platform"]
    check(run, 0)
    assert _starts_a_command(run.out + run.err) == [] and "from macOS\\x0a::error file=x.py" in run.err


@pytest.mark.parametrize("name", ["r4_forged_table", "r4_forged_target"])
def test_r4_module_names_and_target_paths_cannot_forge_workflow_commands(ran, name):
    run, folder = ran[name]
    check(run, 0, folders=[folder / "out"], verbose=name == "r4_forged_target")
    assert _starts_a_command(run.out) == [] and _starts_a_command(run.err) == [], run.out + run.err
    assert "\\x0a::error file=forged" in run.out  # the name is shown, escaped, in the rows and the sections
    if name == "r4_forged_target":
        assert "tracing " in run.err and "\\x0a::error file=forged.py::target path" in run.err


def test_r4_a_model_name_over_255_bytes_gets_its_default_folder(ran):
    from opscan.trust.names import NAME_BYTES

    run, folder = ran["r4_wide_name"]
    check(run, 0, folders=[folder / "reports"])
    (made,) = (folder / "reports").iterdir()
    assert len(made.name.encode()) <= NAME_BYTES and (made / "report.json").is_file()


def test_r4_sarif_uris_stay_in_the_repository_through_a_linked_model_folder(ran):
    run, folder = ran["r4_linked_project"]
    check(run, 0, fmt="json")
    uris = [loc["physicalLocation"]["artifactLocation"] for result in json.loads(run.out)["runs"][0]["results"]
            for loc in result.get("locations", [])]
    assert uris and all(u == {"uri": "models/helper.py", "uriBaseId": "PROJECTROOT"} for u in uris), uris
