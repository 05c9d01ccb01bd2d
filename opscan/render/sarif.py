"""Render stage: the report as SARIF 2.1.0 for code scanning (GitHub's, and any SARIF viewer).

One run; `tool.driver.rules` holds each evidence rule id the findings cite (its verdict and source), and every
finding — one per cause, a line of the user's code and a rule (report/findings.py), most severe first — is one
result: `ruleId` its rule, `level` from its verdict's severity (`LEVELS`: crash, timeout, error, mismatch,
unsupported and unsupported_dtype are errors, cpu_fallback a warning, unknown a note), the message saying which ops
its line makes and what happens to them on MPS, what to do and where it belongs upstream, and `locations` its line:
`physicalLocation` with the file relative to the project folder (`uriBaseId` PROJECTROOT), `region.startLine` and
the line's text as `region.snippet`. A finding no line of the user's code caused (a module target such as
`torchvision.models:resnet18`), or made in a notebook's cell, has no location; the library's own line (`via`) is
said in the message. A finding whose line made a tensor that met MPS kernels elsewhere (a placement finding) lists
those lines as `relatedLocations`. `partialFingerprints` keys a result by its file, function, the line's text and
rule (not the line's number), so a rerun matches it after lines above it moved. Validated against the OASIS SARIF
2.1.0 schema in tests/test_ci_formats.py.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from opscan.report import Report
from opscan.report.findings import Finding
from opscan.report.where import short_place
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
    rules = list(dict.fromkeys(f.rule for f in findings))
    described = [_rule(rule, [f for f in findings if f.rule == rule]) for rule in rules]
    run = {
        "tool": {"driver": {"name": "opscan", "version": report.opscan_version,
                            "informationUri": "https://github.com/opscan/opscan", "rules": described}},
        "originalUriBaseIds": {BASE_ID: {"description": {"text": PROJECT_TEXT}}},
        "results": [_result(f, rules.index(f.rule), report) for f in findings],
        "properties": {"model": report.model, "mode": report.mode, "lane": report.lane.name,
                       "torch_release": report.assumptions.get("torch_release"),
                       "macos": report.assumptions.get("macos"), "kb_version": report.kb_version},
    }
    return strict_json({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"


def _rule(rule: str, findings: list[Finding]) -> dict[str, Any]:
    worst = max(findings, key=lambda f: f.verdict.rank)
    verdicts = list(dict.fromkeys(f.verdict.value for f in findings))
    return {"id": rule, "name": rule,
            "shortDescription": {"text": sarif_text(f"opscan rule {rule}: {', '.join(verdicts)} on MPS")},
            "fullDescription": {"text": sarif_text(f"Source: {worst.evidence_source}")},
            "defaultConfiguration": {"level": level_of(worst.verdict)},
            "properties": {"tags": ["mps", *verdicts]}}


def _result(finding: Finding, index: int, report: Report) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.rule, "ruleIndex": index, "level": level_of(finding.verdict),
        "message": {"text": sarif_text(message(finding, report))},
        "partialFingerprints": {"opscanFinding/v1": finding.key},
        "properties": {"verdict": finding.verdict.value, "source": finding.source.value, "ops": list(finding.ops),
                       "parts": [p.to_dict() for p in finding.parts], "phases": list(finding.phases),
                       "modules": list(finding.modules), "calls": finding.calls,
                       "upstream": finding.upstream.kind},
    }
    if located(finding.site):
        result["locations"] = [_location(finding.site)]
    met = [m for m in finding.met if located(m)]  # a tensor made at its line met MPS kernels at these
    if met:
        result["relatedLocations"] = [{**_location(m), "id": i, "message": {"text": "met MPS kernels here"}}
                                      for i, m in enumerate(met)]
    return result


def located(site: dict[str, Any] | None) -> bool:
    """Whether a finding's site is a file a code-scanning view can open (a notebook's cell is not)."""
    return bool(site and site.get("file") and site.get("line") and site.get("cell") is None)


def _location(place: dict[str, Any]) -> dict[str, Any]:
    file = str(place["file"])
    artifact = ({"uri": PurePosixPath(file).as_uri()} if file.startswith("/")
                else {"uri": quote(file), "uriBaseId": BASE_ID})
    region: dict[str, Any] = {"startLine": int(place["line"])}
    if place.get("text"):
        region["snippet"] = {"text": sarif_text(place["text"])}
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": artifact, "region": region}}
    if place.get("function"):
        location["logicalLocations"] = [{"fullyQualifiedName": sarif_text(place["function"]), "kind": "function"}]
    return location


def message(finding: Finding, report: Report) -> str:
    """One finding in a few sentences: what happens on MPS and to which ops, why, what to do, the library's line, and
    where it belongs upstream."""
    release = report.assumptions.get("torch_release")
    calls = f"{finding.calls} call{'s' * (finding.calls != 1)}"
    if finding.met:  # the line made a tensor; the calls that read it were made elsewhere
        calls += " reading the tensor made at this line, at " + ", ".join(short_place(m) for m in finding.met)
    elif located(finding.site):
        calls += " made at this line"
    where = "MPS" if finding.parts else "a Mac"  # a finding no row holds is about the code (device code)
    text = _sentence(f"{finding.summary()}: {finding.verdict.value} on {where} ({finding.source.value} for torch "
                     f"{release}; {calls}): {finding.why}")
    if finding.fix:
        text += " " + _sentence(f"Fix: {finding.fix}")
    via = (finding.site or {}).get("via")
    if via:
        text += f" Called through {via['file']}:{via['line']} in {via['function']}."
    return text + " " + _sentence(f"Upstream: {finding.upstream.text}")


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "!", "?", ")")) else text + "."
