"""Render stage: the report as JUnit XML for CI servers (Jenkins, GitLab, GitHub test reporters).

One <testcase> per row (classname: the module it was first seen in, name: OpKey and dtype signature);
a row that fails the gate (baseline.failures: at or above --fail-on, or new/worse than --baseline) gets a
<failure>, every other non-native row passes with its verdict in <system-out>. A finding no row holds (a line of
code that picks a device, report/findings.py) is a <testcase> of its own (classname `opscan.code`), gated alike.
Validated against the Jenkins junit-10.xsd that CI servers read (tests/schemas/junit-10.xsd).
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr as _quoteattr

from opscan.opkey import signature_text
from opscan.render.gate import code_failures, failures
from opscan.report import Report, Row
from opscan.report.where import at_text
from opscan.trust.text import xml_text


def render_junit(report: Report, *, fail_on: str | None = None, baseline=None, **_) -> str:
    """JUnit XML of the report; failures as the exit code would count them."""
    failing = failures(report.rows, fail_on, baseline)
    code = code_failures(report.findings, fail_on, baseline)
    cases = [_case(row, failing.get(i)) for i, row in enumerate(report.rows)]
    cases += [_code_case(f, code.get(i)) for i, f in enumerate(report.findings) if not f.parts]
    attrs = (f'name={quoteattr("opscan " + report.model)} tests="{len(cases)}" failures="{len(failing) + len(code)}" '
             f'errors="0" time="0"')
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites {attrs}>\n<testsuite {attrs} skipped="0">\n<properties>\n'
            + "".join(f"<property name={quoteattr(k)} value={quoteattr(str(v))}/>\n" for k, v in _props(report))
            + "</properties>\n" + "".join(cases) + "</testsuite>\n</testsuites>\n")


def _props(report: Report):
    yield "lane", report.lane.name
    yield "mode", report.mode
    for key in ("torch_release", "installed_torch", "macos"):
        yield key, report.assumptions.get(key)
    yield "kb_version", report.kb_version


def _case(row: Row, why: str | None) -> str:
    name = quoteattr(f"{row.op.display} [{signature_text(row.dtypes)}]")
    classname = quoteattr("opscan." + ((row.modules[0] if row.modules else "") or "model"))
    body = _body(row.verdict.value, row.source.value, row.evidence.text, row.remedy, why, bool(row.verdict.rank))
    return f'<testcase classname={classname} name={name} time="0">{body}</testcase>\n'


def _code_case(finding, why: str | None) -> str:
    name = quoteattr(f"{finding.summary()} at {at_text(finding.site) or '(no line)'}")
    body = _body(finding.verdict.value, finding.source.value, finding.why, finding.fix, why, True)
    return f'<testcase classname="opscan.code" name={name} time="0">{body}</testcase>\n'


def quoteattr(text: str) -> str:
    """An attribute value: the characters XML 1.0 forbids (a control character in a module name) as visible
    escapes (opscan/trust/text.py), then quoted."""
    return _quoteattr(xml_text(text))


def _text(text: str) -> str:
    return xml_text(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _body(verdict: str, source: str, reason: str, fix: str | None, why: str | None, shown: bool) -> str:
    """A test case's body: a failure with `why` when the gate fails it, else its text as system-out (`shown`)."""
    text = f"{verdict} ({source}): {reason}" + (f"\nfix: {fix}" if fix else "")
    if why is not None:
        return f"<failure type={quoteattr(verdict)} message={quoteattr(f'{verdict}: {why}')}>{_text(text)}</failure>"
    return f"<system-out>{_text(text)}</system-out>" if shown else ""
