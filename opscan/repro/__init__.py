"""Repro stage: standalone repro scripts and ISSUE.md files for a report's findings (issue #8).

- section.py: the report's `repro` section (built at scan time: what the scripts need, from report.json alone);
- script.py + runtime.py: one script per call (data through repr, then the runtime verbatim);
- issue.py: ISSUE.md per upstream-worthy cause, in the shape of PyTorch's bug template, led by snippet.py's minimal
  snippet (public_calls.py: the public call of an aten op), the full script attached beside it;
- redact.py: paths and user names out of the files (file names relative to the project; --keep-paths keeps them);
- minimize.py: shrink a shape-dependent failure to its boundary in the real probe worker;
- opscan/cli/repro.py: `opscan repro REPORT OP`.

Scripts: `repro/<op>/repro_N.py`, one per replayable call of every finding row, numbered per op. ISSUE.md: one per
cause worth an upstream report (the report's `findings`, report/findings.py and report/upstream.py: not for the
user's own bug, a documented limitation, a custom op, a release that already fixed it, an undecided row, a known
issue or the missing-ops tracker, which the finding links instead), in the folder of the cause's first op, with
the scripts of all its ops attached. `render_files(report)` is pure (report dict in, file texts out); only the CLI
modules write files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscan.errors import OpscanError
from opscan.opkey import OpKey, Release


class ReproError(OpscanError):
    """A report that cannot give repros (no `repro` section), or an OP it does not have."""


@dataclass(frozen=True)
class Cause:
    """What one ISSUE.md is about: its first op (the folder it goes in), the report rows it covers, the lines of the
    user's code that caused them, and the findings' upstream decision (report/upstream.py's `to_dict()`)."""

    op: str
    rows: tuple[int, ...]
    sites: tuple[dict, ...]
    upstream: dict


def folder_of(op: str) -> str:
    """"aten::take" -> "aten_take"; "aten::add.Tensor" -> "aten_add.Tensor"; an op named by a crafted report
    (`../x::y`) goes through the one path sanitiser (opscan/trust/names.py) like every other name."""
    from opscan.trust.names import safe_name

    key = OpKey.parse(op)
    return safe_name(f"{key.namespace}_{key.name}" + ("" if key.overload == "default" else f".{key.overload}"), "op")


def findings_by_op(report: dict) -> dict[str, list[dict]]:
    """The repro section's findings grouped by OpKey display name, in report order."""
    section = report.get("repro")
    if not isinstance(section, dict) or not isinstance(section.get("findings"), list):
        raise ReproError("the report has no `repro` section — rescan with --repro (it records what the scripts need)")
    grouped: dict[str, list[dict]] = {}
    for finding in section["findings"]:
        grouped.setdefault(finding["op"], []).append(finding)
    return grouped


def causes(report: dict) -> list[Cause]:
    """The report's causes, one per first op (its `findings` that hold rows, most severe first: a line of code no row
    holds has no script), then one per repro finding row no
    finding holds (a row native on MPS that failed where it was measured, on cpu or cuda), judged by
    report/upstream.py from the row alone — as every row of a report written before schema 4 (no `findings`)."""
    rows = [f for f in report["repro"]["findings"] if isinstance(f.get("row"), int)]
    found = report.get("findings")
    listed = [Cause(f["parts"][0]["op"], tuple(p["row"] for p in f["parts"]), (f["site"],) if f.get("site") else (),
                    f["upstream"]) for f in (found if isinstance(found, list) else []) if f.get("parts")]
    covered = {r for cause in listed for r in cause.rows}
    return list(_merged([*listed, *(_row_cause(report, f) for f in rows if f["row"] not in covered)]).values())


def _merged(found: list[Cause]) -> dict[str, Cause]:
    """One cause per first op (one ISSUE.md per folder): the same first op at other lines or with other dtype
    signatures joins the first, reported when any of them is worth it."""
    merged: dict[str, Cause] = {}
    for cause in found:
        old = merged.get(cause.op)
        if old is None:
            merged[cause.op] = cause
            continue
        better = old.upstream if old.upstream.get("issue") or not cause.upstream.get("issue") else cause.upstream
        merged[cause.op] = Cause(cause.op, tuple(dict.fromkeys(old.rows + cause.rows)), old.sites + cause.sites,
                                 better)
    return merged


def _row_cause(report: dict, finding: dict) -> Cause:
    from opscan.report.upstream import upstream_of

    row = report["ops"][finding["row"]]
    evidence, verdict = row.get("evidence") or {}, row.get("verdict")
    if verdict == "native" and isinstance(row.get("measured"), dict):  # what failed is where it was measured
        evidence, verdict = row["measured"], row["measured"].get("verdict")
    texts = [evidence.get("text"), evidence.get("source")]
    predicted = ((row.get("predicted") or {}).get("evidence") or {}).get("rule")
    found = upstream_of(str(evidence.get("rule")), str(verdict), [finding["op"]], _later(report, row), texts,
                        (row.get("silent") or {}).get("issues") or (), [predicted] if predicted else (),
                        row.get("dtypes") or ())
    sites = tuple(p for p in row.get("where") or () if isinstance(p, dict))
    return Cause(finding["op"], (finding["row"],), sites, found.to_dict())


def _later(report: dict, row: dict) -> str | None:
    """The row's `since` when it is later than the release the report was judged for."""
    release, since = (report.get("assumptions") or {}).get("torch_release"), row.get("since")
    try:
        return since if since and (not release or Release.parse(since) > Release.parse(release)) else None
    except (ValueError, TypeError):
        return None


def render_files(report: dict, device: str = "mps", real_outputs: dict | None = None, keep_paths: bool = False,
                 every_finding: bool = False, rows: set[int] | None = None) -> dict[str, str]:
    """Relative path (under "repro/") -> file text: `repro/<op>/repro_N.py` per replayable call of every finding
    row and `repro/<op>/ISSUE.md` per cause worth an upstream report (`every_finding`: per cause, worth it or not,
    headed by why opscan would not file it). `real_outputs` maps a CALL's probe id (the repro section's
    `findings[].calls[].probe.id`) to {"device", "exit_code", "output", "environment"} from running that call's
    script on the real device: ISSUE.md shows it only under the script of the call with that id, whatever number
    the script has. `rows`: only the causes holding these report rows, with the scripts they attach. Paths and
    user names are redacted (redact.py) unless `keep_paths`. Deterministic on one machine (the redaction reads its
    home folder and project files)."""
    from opscan.repro.issue import issue_text
    from opscan.repro.redact import redaction_for

    grouped = findings_by_op(report)
    if not keep_paths:
        redaction = redaction_for(report)
        report, grouped, real_outputs = (redaction.apply(x) for x in (report, grouped, real_outputs))
    chosen = [c for c in causes(report) if rows is None or set(c.rows) & rows]
    wanted = None if rows is None else rows | {r for c in chosen for r in c.rows}
    files, scripts = _scripts(report, grouped, device, wanted)
    by_row = {f["row"]: f for found in grouped.values() for f in found if isinstance(f.get("row"), int)}
    for cause in chosen:
        present = [by_row[r] for r in cause.rows if r in by_row]
        if not present or not (cause.upstream.get("issue") or every_finding):
            continue
        folder = f"repro/{folder_of(cause.op)}"
        attached = [(_relative(path, folder), text, call) for r in cause.rows
                    for path, text, call in scripts.get(r, [])]
        files[f"{folder}/ISSUE.md"] = issue_text(report, cause.op, present, attached, device, real_outputs, cause)
    return files


def _scripts(report: dict, grouped: dict[str, list[dict]], device: str, rows: set[int] | None
             ) -> tuple[dict[str, str], dict[int, list[tuple[str, str, dict]]]]:
    """(path -> script text, report row -> its (path, text, call) in order): the scripts of every op's findings,
    numbered per op, each call that can be replayed (only the rows in `rows`, when given)."""
    from opscan.repro.script import script_text

    files: dict[str, str] = {}
    by_row: dict[int, list[tuple[str, str, dict]]] = {}
    for op, findings in grouped.items():
        folder, number = f"repro/{folder_of(op)}", 0
        for finding in findings:
            for call in finding.get("calls") or []:
                if call.get("unbuildable"):
                    continue
                number += 1
                if rows is not None and isinstance(finding.get("row"), int) and finding["row"] not in rows:
                    continue  # (a finding without a row number, from an edited report, is always written)
                path = f"{folder}/repro_{number}.py"
                files[path] = script_text(report, finding, call, f"repro_{number}.py", device)
                by_row.setdefault(finding.get("row"), []).append((path, files[path], call))
    return files, by_row


def _relative(path: str, folder: str) -> str:
    """A script's path as ISSUE.md in `folder` names it: "repro_1.py", or "../aten_put_/repro_1.py"."""
    return path[len(folder) + 1:] if path.startswith(folder + "/") else "../" + path.split("/", 1)[1]


def render_op(report: dict, op: str, findings: list[dict], device: str = "mps", real_outputs: dict | None = None,
              keep_paths: bool = False, every_finding: bool = False) -> dict[str, str]:
    """The files of one OpKey's findings (`findings`: its repro findings, maybe minimised): their scripts, and the
    ISSUE.md of each cause they belong to, with the scripts it attaches (see render_files)."""
    given = {f["row"]: f for f in findings if isinstance(f.get("row"), int)}
    section = dict(report["repro"])
    section["findings"] = [given.get(f.get("row"), f) for f in section["findings"]]
    return render_files({**report, "repro": section}, device, real_outputs, keep_paths, every_finding,
                        rows=set(given))


def not_reported(report: dict, rows: set[int]) -> list[tuple[str, dict]]:
    """(first op, upstream decision) of each cause holding `rows` that gets no ISSUE.md: what to say instead."""
    return [(c.op, c.upstream) for c in causes(report) if set(c.rows) & rows and not c.upstream.get("issue")]


def upstream_line(op: str, upstream: dict[str, Any]) -> str:
    """One line: why a cause of `op` gets no ISSUE.md, and where it belongs."""
    return f"no ISSUE.md for {op}: {upstream.get('text')}"
