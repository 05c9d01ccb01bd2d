"""CLI layer: the user's report files a command reads — untrusted input, read by the one reader
(opscan/trust/read.py: size, nesting and encoding limits).

`load_baseline` (`--baseline`): the rows of an earlier report.json for the gate (render/gate.py);
`check_report_rows`: a report.json whose rows are not rows as a scan writes them is refused first, naming the row.
A file that cannot be read, or is not a report, is one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

from opscan.errors import UsageError
from opscan.trust.read import read_json


def load_baseline(path: str | Path):
    """Read a report.json written by opscan as a render.gate.Baseline; a missing or malformed file is a usage
    error (exit 2)."""
    from opscan.render.gate import baseline_from

    doc = read_json(path, "the baseline", "pass the report.json of an earlier scan", expected="an opscan report.json")
    try:
        return baseline_from(doc, str(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"the baseline {str(path)!r} is not an opscan report.json ({type(exc).__name__}: {exc}) "
                         "— pass the report.json of an earlier scan") from None


def check_report_rows(path: str, what: str) -> None:
    """A report.json whose `ops` are rows (objects with op, overload, dtypes, verdict of the right types), else
    a UsageError naming `what` and the first bad row."""
    from opscan.verdict import Verdict

    doc = read_json(path, what, "pass the report.json of an earlier scan", expected="an opscan report.json")
    rows = doc.get("ops") if isinstance(doc, dict) else None
    names = {v.value for v in Verdict}
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if not _is_row(row, names):
            raise UsageError(f"{what} {path!r} is not an opscan report.json: ops[{i}] is not a row (op, overload, "
                             f"dtypes and verdict, as a scan writes them) — pass the report.json of an earlier scan")


def _is_row(row, verdicts: set[str]) -> bool:
    if not isinstance(row, dict) or not isinstance(row.get("op"), str) or row.get("verdict") not in verdicts:
        return False
    dtypes = row.get("dtypes")
    return isinstance(row.get("overload"), (str, type(None))) and isinstance(dtypes, list) and \
        all(isinstance(d, str) for d in dtypes)
