"""Render stage: the report as SARIF 2.1.0 for code scanning (GitHub's, and any SARIF viewer).

One run; `tool.driver.rules` holds each evidence rule id the findings cite (its verdict and source), and every
finding row (a verdict above native, most severe first) is one result: `ruleId` its evidence rule, `level` from
its verdict's severity (`LEVELS`: crash, timeout, error, mismatch, unsupported and unsupported_dtype are errors,
cpu_fallback a warning, unknown a note), the message saying what happens on MPS and what to do, and `locations`
the lines of the user's code that made its calls (the row's `where`, report/where.py): `physicalLocation` with the
file relative to the project folder (`uriBaseId` PROJECTROOT) and `region.startLine`. A row whose calls no line of
the user's code made (a module target such as `torchvision.models:resnet18`) has no location; the library's own
line (`via`) is said in the message. `partialFingerprints` keys a result by its row (op and dtype signature), so a
rerun matches it. Validated against the OASIS SARIF 2.1.0 schema in tests/test_ci_formats.py.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from opscan.opkey import signature_text
from opscan.report import Report, Row
from opscan.trust.text import sarif_text, strict_json
from opscan.verdict import Verdict

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
BASE_ID = "PROJECTROOT"
PROJECT_TEXT = ("The scanned project's folder: the nearest folder above the target holding .git, pyproject.toml, "
                "setup.py or setup.cfg.")
LEVELS = {Verdict.UNKNOWN: "note", Verdict.CPU_FALLBACK: "warning"}  # every verdict ranked above: "error"


def level_of(verdict: Verdict) -> str:
    """The SARIF level of a finding's verdict: "error", "warning" or "note"."""
    return LEVELS.get(verdict, "error" if verdict.rank > 0 else "none")


def render_sarif(report: Report, **_) -> str:
    """The report as one SARIF 2.1.0 log (JSON text)."""
    findings = report.findings
    rules = list(dict.fromkeys(r.evidence.rule for r in findings))
    described = [_rule(rule, [r for r in findings if r.evidence.rule == rule]) for rule in rules]
    run = {
        "tool": {"driver": {"name": "opscan", "version": report.opscan_version,
                            "informationUri": "https://github.com/opscan/opscan", "rules": described}},
        "originalUriBaseIds": {BASE_ID: {"description": {"text": PROJECT_TEXT}}},
        "results": [_result(row, rules.index(row.evidence.rule), report) for row in findings],
        "properties": {"model": report.model, "mode": report.mode, "lane": report.lane.name,
                       "torch_release": report.assumptions.get("torch_release"),
                       "macos": report.assumptions.get("macos"), "kb_version": report.kb_version},
    }
    return strict_json({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"


def _rule(rule: str, rows: list[Row]) -> dict[str, Any]:
    worst = max(rows, key=lambda r: r.verdict.rank)
    verdicts = list(dict.fromkeys(r.verdict.value for r in rows))
    return {"id": rule, "name": rule,
            "shortDescription": {"text": sarif_text(f"opscan rule {rule}: {', '.join(verdicts)} on MPS")},
            "fullDescription": {"text": sarif_text(f"Source: {worst.evidence.source}")},
            "defaultConfiguration": {"level": level_of(worst.verdict)},
            "properties": {"tags": ["mps", *verdicts]}}


def _result(row: Row, index: int, report: Report) -> dict[str, Any]:
    located = [p for p in row.where if p.get("file")]
    result: dict[str, Any] = {
        "ruleId": row.evidence.rule, "ruleIndex": index, "level": level_of(row.verdict),
        "message": {"text": sarif_text(message(row, report))},
        "partialFingerprints": {"opscanRow/v1": f"{row.op.display}|{','.join(row.dtypes)}"},
        "properties": {"verdict": row.verdict.value, "source": row.source.value, "op": row.op.display,
                       "dtypes": list(row.dtypes), "phases": list(row.phases), "modules": list(row.modules),
                       "calls": row.calls},
    }
    if located:
        result["locations"] = [_location(p) for p in located]
    return result


def _location(place: dict[str, Any]) -> dict[str, Any]:
    file = str(place["file"])
    artifact = ({"uri": PurePosixPath(file).as_uri()} if file.startswith("/")
                else {"uri": quote(file), "uriBaseId": BASE_ID})
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": artifact,
                                                     "region": {"startLine": int(place["line"])}}}
    if place.get("function"):
        location["logicalLocations"] = [{"fullyQualifiedName": sarif_text(place["function"]), "kind": "function"}]
    return location


def message(row: Row, report: Report) -> str:
    """One finding in a sentence or three: what happens on MPS, why, what to do, and the library's line."""
    release = report.assumptions.get("torch_release")
    text = _sentence(f"{row.op.display} [{signature_text(row.dtypes)}] is {row.verdict.value} on MPS "
                     f"({row.source.value} for torch {release}): {row.evidence.text}")
    if row.remedy:
        text += " " + _sentence(f"Fix: {row.remedy}")
    vias = list(dict.fromkeys(f"{v['file']}:{v['line']} in {v['function']}" for p in row.where if (v := p.get("via"))))
    if vias:
        text += f" Called through {', '.join(vias[:3])}{' …' if len(vias) > 3 else ''}."
    return text


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "!", "?", ")")) else text + "."
