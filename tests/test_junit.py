"""`--format junit`: one test case per row, failures for rows that fail the gate, valid against the Jenkins
JUnit schema CI servers read (tests/schemas/junit-10.xsd, MIT, from pytest's test suite)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from opscan.render.gate import Baseline, row_key
from opscan.render.junit import render_junit
from opscan.verdict import Verdict

from conftest import TESTS
from helpers_graph import REL_ATTENTION, scanned
from helpers_report import report, row

xmlschema = pytest.importorskip("xmlschema", reason="xmlschema (a dev dependency) validates the JUnit XML")
SCHEMA = xmlschema.XMLSchema(str(TESTS / "schemas" / "junit-10.xsd"))


def cases(xml: str) -> dict[str, ET.Element]:
    SCHEMA.validate(xml)
    return {c.get("name"): c for c in ET.fromstring(xml).iter("testcase")}


def test_one_case_per_row_and_no_failure_without_fail_on():
    found = cases(render_junit(report()))
    assert len(found) == len(report().rows)
    assert not any(c.find("failure") is not None for c in found.values())
    assert "cpu_fallback" in found["aten::upsample_bicubic2d.out [float32]"].find("system-out").text


def test_rows_at_or_above_fail_on_are_failures():
    xml = render_junit(report(), fail_on="cpu_fallback")
    found = cases(xml)
    failed = sorted(name for name, c in found.items() if c.find("failure") is not None)
    assert failed == ["aten::add.Tensor [float64×2]", "aten::upsample_bicubic2d.out [float32]"]
    suite = ET.fromstring(xml).find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "2")
    failure = found["aten::add.Tensor [float64×2]"].find("failure")
    assert failure.get("type") == "unsupported_dtype" and "cast to float32" in failure.text


def test_with_a_baseline_only_new_or_worse_rows_fail():
    base = {row_key(r): r.verdict for r in report().rows}
    base[row_key(report().rows[2])] = Verdict.NATIVE  # add.Tensor float64 was native: now worse
    del base[row_key(report().rows[1])]  # upsample was not there: new
    found = cases(render_junit(report(), fail_on="unsupported", baseline=Baseline("b.json", base)))
    failed = {name: c.find("failure").get("message") for name, c in found.items() if c.find("failure") is not None}
    assert failed == {"aten::add.Tensor [float64×2]": "unsupported_dtype: worse than native"}


def test_markup_in_evidence_is_escaped():
    odd = row("aten::take", ["float32"], Verdict.UNSUPPORTED, ["a<b>&\"c"], text="x < y & \"z\" ]]> done")
    xml = render_junit(report(rows=(odd,)), fail_on="unknown")
    (case,) = cases(xml).values()
    assert case.get("classname") == 'opscan.a<b>&"c' and "]]> done" in case.find("failure").text


def test_a_real_scan_validates():
    found = cases(render_junit(scanned(REL_ATTENTION), fail_on="unsupported"))
    failed = sorted(n for n, c in found.items() if c.find("failure") is not None)
    assert failed == ["aten::put_ [float32,int64,float32]", "aten::take [float32,int64]"]
