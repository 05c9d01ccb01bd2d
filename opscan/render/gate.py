"""CI gating: which rows fail, against `--fail-on` and optionally a baseline report (the CLI reads its file with
json only: opscan/cli/read.py; here it is data).

With `--baseline report.json` only rows that are new (their OpKey and dtype signature are not in the
baseline) or worse (a higher verdict rank than there) can fail; without `--fail-on` they fail from
`unknown` up (every non-native regression). Without a baseline, every row at or above `--fail-on` fails.

A finding no row holds (a line of code that picks a device: `raises` is error, `cpu` cpu_fallback; report/findings.py)
is gated the same way by its verdict, matched against the baseline's `findings` by its key (file, function, the
line's text, rule). A placement finding's rows are `error` and gate as rows do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opscan.opkey import OpKey
from opscan.report import Row
from opscan.verdict import Verdict

RowKey = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class Baseline:
    """The rows of an earlier report: (OpKey display, input dtypes) -> verdict."""

    path: str
    verdicts: dict[RowKey, Verdict]
    findings: dict[str, Verdict] = field(default_factory=dict)  # its findings' keys (schema 4) -> verdict


def row_key(row: Row) -> RowKey:
    """How rows are matched across reports: OpKey and dtype signature."""
    return row.op.display, tuple(row.dtypes)


def baseline_from(doc, path: str) -> Baseline:
    """The Baseline of a report.json's parsed JSON (`doc`, read from `path`); ValueError, KeyError or TypeError
    when it is not one."""
    verdicts = {(OpKey.from_json(r["op"], r["overload"]).display, tuple(r["dtypes"])): Verdict(r["verdict"])
                for r in doc["ops"]}
    listed = doc.get("findings") or []
    if not isinstance(listed, list):
        raise TypeError("its `findings` is not a list")
    findings = {str(f["key"]): Verdict(f["verdict"]) for f in listed if not f["parts"]}
    return Baseline(str(path), verdicts, findings)


def regression(row: Row, baseline: Baseline) -> str | None:
    """'new' or 'worse than <verdict>' when the row regressed against the baseline, else None."""
    before = baseline.verdicts.get(row_key(row))
    if before is None:
        return "new"
    return f"worse than {before.value}" if row.verdict.rank > before.rank else None


def code_failures(findings, fail_on: str | None, baseline: Baseline | None) -> dict[int, str]:
    """Finding index -> why it fails, for the findings no row holds (the others fail through their rows)."""
    rank = threshold(fail_on, baseline)
    out: dict[int, str] = {}
    if rank is None:
        return out
    for i, finding in enumerate(findings):
        if finding.parts or finding.verdict.rank < rank:
            continue
        before = baseline.findings.get(finding.key) if baseline is not None else None
        if baseline is None:
            out[i] = f"ranks at or above {fail_on}"
        elif before is None or finding.verdict.rank > before.rank:
            out[i] = "new" if before is None else f"worse than {before.value}"
    return out


def threshold(fail_on: str | None, baseline: Baseline | None) -> int | None:
    """The rank at which rows fail (None: nothing fails)."""
    if fail_on is not None:
        return Verdict(fail_on).rank
    return Verdict.UNKNOWN.rank if baseline is not None else None


def failures(rows: tuple[Row, ...], fail_on: str | None, baseline: Baseline | None) -> dict[int, str]:
    """Row index -> why it fails ('unsupported ≥ cpu_fallback', 'new', 'worse than native', ...)."""
    rank = threshold(fail_on, baseline)
    out: dict[int, str] = {}
    if rank is None:
        return out
    for i, row in enumerate(rows):
        if row.verdict.rank < rank:
            continue
        why = regression(row, baseline) if baseline is not None else f"ranks at or above {fail_on}"
        if why is not None:
            out[i] = why
    return out
