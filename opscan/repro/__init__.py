"""Repro stage: standalone repro scripts and ISSUE.md files for a report's findings (issue #8).

- section.py: the report's `repro` section (built at scan time: what the scripts need, from report.json alone);
- script.py + runtime.py: one script per call (data through repr, then the runtime verbatim);
- issue.py: ISSUE.md per failing OpKey, in the shape of PyTorch's bug template, led by snippet.py's minimal
  snippet (public_calls.py: the public call of an aten op), the full script attached beside it;
- redact.py: paths and user names out of the files (file names relative to the project; --keep-paths keeps them);
- minimize.py: shrink a shape-dependent failure to its boundary in the real probe worker;
- opscan/cli/repro.py: `opscan repro REPORT OP`.

`render_files(report)` is pure (report dict in, file texts out); only the CLI modules write files.
"""

from __future__ import annotations

from opscan.errors import OpscanError
from opscan.opkey import OpKey


class ReproError(OpscanError):
    """A report that cannot give repros (no `repro` section), or an OP it does not have."""


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


def render_files(report: dict, device: str = "mps", real_outputs: dict | None = None,
                 keep_paths: bool = False) -> dict[str, str]:
    """Relative path (under "repro/") -> file text, for every finding of a report dict (report.json's content):
    `repro/<op>/repro_N.py` per replayable call and `repro/<op>/ISSUE.md` per OpKey. `real_outputs` maps a
    CALL's probe id (the repro section's `findings[].calls[].probe.id`) to {"device", "exit_code", "output",
    "environment"} from running that call's script on the real device: ISSUE.md shows it only under the script
    of the call with that id, whatever number the script has. Paths and user names are redacted (redact.py)
    unless `keep_paths`. Deterministic on one machine (the redaction reads its home folder and project files)."""
    out: dict[str, str] = {}
    for op, findings in findings_by_op(report).items():
        out.update(render_op(report, op, findings, device, real_outputs, keep_paths))
    return out


def render_op(report: dict, op: str, findings: list[dict], device: str = "mps",
              real_outputs: dict | None = None, keep_paths: bool = False) -> dict[str, str]:
    """The files of one OpKey's findings (see render_files)."""
    from opscan.repro.issue import issue_text
    from opscan.repro.redact import redaction_for
    from opscan.repro.script import script_text

    if not keep_paths:
        redaction = redaction_for(report)
        report, findings, real_outputs = (redaction.apply(x) for x in (report, findings, real_outputs))
    folder = f"repro/{folder_of(op)}"
    scripts: list[tuple[str, str, dict]] = []
    for finding in findings:
        for call in finding.get("calls") or []:
            if call.get("unbuildable"):
                continue
            name = f"repro_{len(scripts) + 1}.py"
            scripts.append((f"{folder}/{name}", script_text(report, finding, call, name, device), call))
    files = {path: text for path, text, _ in scripts}
    files[f"{folder}/ISSUE.md"] = issue_text(report, op, findings, scripts, device, real_outputs)
    return files
