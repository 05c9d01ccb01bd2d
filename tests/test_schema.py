"""The report JSON schema (opscan/schema/report-v4.json): a valid draft 2020-12 schema that accepts what
`Report.to_dict()` writes and rejects what the contract forbids. Real scans are validated in test_models."""

from __future__ import annotations

import copy
import json
from importlib import resources

import jsonschema
import pytest

from opscan.verdict import Verdict

from helpers_report import report


def load_schema() -> dict:
    """The schema as shipped inside the package."""
    return json.loads(resources.files("opscan").joinpath("schema/report-v4.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def validator():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_hand_built_report_is_valid(validator):
    validator.validate(report().to_dict())


def test_verdict_enum_matches_the_code():
    assert load_schema()["$defs"]["verdict"]["enum"] == [v.value for v in Verdict]
    assert load_schema()["properties"]["summary"]["required"] == [v.value for v in Verdict]


def test_new_top_level_sections_are_allowed(validator):
    doc = report().to_dict()
    doc["provenance"] = {"script": "repro.py"}  # a section a later issue adds
    validator.validate(doc)


def _first_row(doc):
    return doc["ops"][0]


BROKEN = {
    "verdict outside the enum": lambda d: _first_row(d).update(verdict="maybe"),
    "op without a namespace": lambda d: _first_row(d).update(op="convolution"),
    "op with the overload glued on": lambda d: _first_row(d).update(op="aten::add.Tensor"),
    "zero calls": lambda d: _first_row(d).update(calls=0),
    "unknown phase": lambda d: _first_row(d).update(phases=["warmup"]),
    "extra row field": lambda d: _first_row(d).update(severity=3),
    "missing remedy": lambda d: _first_row(d).pop("remedy"),
    "evidence without rule": lambda d: _first_row(d)["evidence"].pop("rule"),
    "measured row without its measurement": lambda d: _first_row(d).update(source="measured"),
    "summary missing a verdict": lambda d: d["summary"].pop("timeout"),
    "unknown lane": lambda d: d["lane"].update(name="mac-maybe"),
    "lane without reasons": lambda d: d["lane"].update(reasons=[]),
    "missing ops": lambda d: d.pop("ops"),
    "wrong schema_version": lambda d: d.update(schema_version=1),
    "lane reason without its kind": lambda d: d["lane"]["why"][0].pop("kind"),
    "lane reason of an unknown kind": lambda d: d["lane"]["why"][0].update(kind="hunch"),
    "lane without its source": lambda d: d["lane"].pop("source"),
    "a section that is neither predicted nor measured": lambda d: d.update(upgrade={
        "release": "2.14.1", "target": None, "text": "no later release", "source": "guessed"}),
    "a known section without its source": lambda d: d.update(upgrade={
        "release": "2.14.1", "target": None, "text": "no later release"}),
    "bad mode": lambda d: d.update(mode="guessed"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_schema_rejects(validator, what):
    doc = copy.deepcopy(report().to_dict())
    BROKEN[what](doc)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(doc)
