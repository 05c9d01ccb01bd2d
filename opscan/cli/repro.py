"""CLI: `opscan repro REPORT.json OP` — write one OpKey's repro scripts, and the ISSUE.md of its cause when that is
worth an upstream report, from a report's `repro` section.

Dispatched from cli.main when the first argument is `repro`. Reads report.json with json only (no scan,
no trace); torch is imported only for --minimize. Writes `<DIR>/repro/<op>/repro_N.py` and the cause's `ISSUE.md`
(DIR: -o, default the report's folder) and prints the paths written, one per line; with --minimize, first
one line per minimised call with its boundary. A cause opscan would not file (the user's own bug, a documented
limitation, a custom op, a fixed or known issue, the missing-ops tracker: report/upstream.py) gets one stderr line
saying where it belongs instead; `--draft` writes its ISSUE.md anyway, headed by that line.

Exit codes: 0 written (with --minimize: every selected finding reproduced on --device and was minimised) · 1
--minimize: some finding was not minimised — its failure did not reproduce on --device (one stdout line), or
none of its calls can be built (one stderr line); its files are written unminimised · 2 usage: unreadable
report, no repro section, unknown OP or dtype, device not usable (one line) · 3 internal error.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from opscan.cli.command import Command
from opscan.cli.common import emit
from opscan.cli.files import write_under
from opscan.cli.options import Parser, seconds
from opscan.errors import ExitCode
from opscan.target.run import RunContext

EPILOG = """\
OP: display spelling, aten::take or aten::take.default or aten::add.Tensor. Scripts: python repro_N.py
[--device mps|cpu|cuda] exits 0 when the failure does not reproduce, 1 when it does, 2 when it cannot run
there; a crash kills the process. --minimize shrinks a shape-dependent failure in the probe workers while
the same failure persists, and reports the smallest failing shapes and the next smaller ones that pass.
"""


def build_parser() -> argparse.ArgumentParser:
    """The `opscan repro` parser."""
    p = Parser(prog="opscan repro", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Standalone repro scripts and an ISSUE.md for one op of a scan's report.")
    p.add_argument("report", metavar="REPORT.json", help="a report.json written by a scan with --repro")
    p.add_argument("op", metavar="OP", help="the op, e.g. aten::take")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="keep the dtype signatures holding this dtype (repeatable)")
    p.add_argument("--device", choices=("mps", "cpu", "cuda"), default="mps",
                   help="the scripts' default device, and where --minimize probes (default mps)")
    p.add_argument("-o", "--output-dir", metavar="DIR", help="where repro/ goes (default: the report's folder)")
    p.add_argument("--minimize", action="store_true", help="shrink the failing call's sizes to the boundary")
    p.add_argument("--draft", action="store_true",
                   help="write the ISSUE.md even when opscan would not file it (a known issue, the missing-ops "
                        "tracker, a documented limitation...): e.g. to comment on the known issue")
    p.add_argument("--keep-paths", action="store_true",
                   help="keep absolute paths and user names in the files (default: file names relative to the "
                        "project, home folders as ~: they are meant for a public tracker)")
    p.add_argument("--probe-timeout", type=seconds, default=60.0, metavar="S",
                   help="limit per probe, seconds above zero (60 s)")
    return p


def _run(args: argparse.Namespace, ctx: RunContext) -> int:
    report = load_report(args.report)
    op, findings = select(report, args.op, args.dtype)
    code = ExitCode.OK
    if args.minimize:
        findings, lines, code = _minimized(findings, args.device, args.probe_timeout)
        emit(ctx, "".join(line + "\n" for line in lines))
    out_dir = Path(args.output_dir) if args.output_dir else Path(args.report).resolve().parent
    files = _rendered(args.report, report, op, findings, args.device, args.keep_paths, args.draft)
    if not args.draft:
        _say_where_instead(report, findings)
    written = write_under(ctx, out_dir, files)
    emit(ctx, "".join(f"{p}\n" for p in written))
    return code


def _say_where_instead(report: dict, findings: list[dict]) -> None:
    """One stderr line per cause of these findings that gets no ISSUE.md: where it belongs instead."""
    from opscan.repro import not_reported, upstream_line

    try:
        causes = not_reported(report, {f["row"] for f in findings if isinstance(f.get("row"), int)})
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return  # a malformed findings section: _rendered said so already
    for op, upstream in causes:
        print(f"opscan: {upstream_line(op, upstream)} (--draft writes it anyway)", file=sys.stderr)


def _rendered(path: str, report: dict, op: str, findings: list[dict], device: str,
              keep_paths: bool = False, draft: bool = False) -> dict[str, str]:
    """The op's files; a report whose repro section has the right shape but not the content a scan writes
    (edited, or from another opscan) fails here as data, not as a bug."""
    from opscan.repro import ReproError, render_op

    try:
        return render_op(report, op, findings, device, keep_paths=keep_paths, every_finding=draft)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ReproError(f"{path!r}: the repro section of {op} is malformed ({type(exc).__name__}: {exc}) — pass a "
                         "report.json a scan with --repro wrote, unedited (if it is one, please report this)") from None


def load_report(path: str) -> dict:
    """report.json as a dict; a missing or malformed file is a ReproError."""
    from opscan.repro import ReproError
    from opscan.trust.read import read_json

    report = read_json(path, "the report", "pass the report.json a scan wrote", expected="an opscan report.json",
                       error=ReproError)
    if not isinstance(report, dict):
        raise ReproError(f"{path!r} is not a report (not a JSON object) — pass the report.json a scan wrote")
    check_findings(report, path)
    return report


def check_findings(report: dict, path: str) -> None:
    """Each finding of the repro section is an object with an op named as an OpKey, its dtypes and its calls
    (objects), else a ReproError naming the first that is not."""
    from opscan.opkey import OpKey
    from opscan.repro import ReproError

    section = report.get("repro")
    findings = section.get("findings") if isinstance(section, dict) else None
    for i, finding in enumerate(findings if isinstance(findings, list) else []):
        why = _not_a_finding(finding, OpKey)
        if why:
            raise ReproError(f"{path!r}: repro.findings[{i}] {why} — pass the report.json a scan with --repro "
                             "wrote, unedited")


def _not_a_finding(finding, opkey) -> str | None:
    """Why `finding` is not a finding of a repro section (None: it is one)."""
    if not isinstance(finding, dict):
        return f"is a {type(finding).__name__}, not an object"
    try:
        opkey.parse(finding.get("op"))
    except (ValueError, TypeError, AttributeError):
        return f"has no valid op name (op: {str(finding.get('op'))[:80]!r})"
    dtypes, calls = finding.get("dtypes"), finding.get("calls")
    if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
        return "has no list of dtype names"
    if calls is not None and (not isinstance(calls, list) or not all(_is_call(c) for c in calls)):
        return "has calls that are not call objects"
    return None


def _is_call(call) -> bool:
    return isinstance(call, dict) and (bool(call.get("unbuildable")) or isinstance(call.get("probe"), dict))


def select(report: dict, op_text: str, dtypes: list[str]) -> tuple[str, list[dict]]:
    """(OpKey display name, its findings) for OP and --dtype; unknown ones raise with the close names."""
    from opscan.opkey import OpKey
    from opscan.repro import ReproError, findings_by_op

    grouped = findings_by_op(report)
    try:
        op = OpKey.parse(op_text).display
    except ValueError:
        op = op_text
    if op not in grouped:
        close = difflib.get_close_matches(op, list(grouped), n=5, cutoff=0.5) or list(grouped)[:8]
        raise ReproError(f"{op_text!r} has no finding in this report — use one of: {', '.join(close) or '(none)'}")
    found = [f for f in grouped[op] if all(d in f["dtypes"] for d in dtypes)]
    if not found:
        signatures = "; ".join(",".join(f["dtypes"]) for f in grouped[op])
        raise ReproError(f"no finding of {op} has dtypes {', '.join(dtypes)} — its signatures: {signatures}")
    return op, found


def _minimized(findings: list[dict], device: str, timeout: float) -> tuple[list[dict], list[str], int]:
    """Each finding with its first buildable call minimised on `device`: (findings, boundary lines, exit code).
    Exit 0 only when every finding reproduced and was minimised; a finding with no buildable call gets one
    stderr line and exit 1, as does one that did not reproduce (its boundary line says so)."""
    from opscan.repro.minimize import minimize_findings

    _check_device(device)
    done = minimize_findings(findings, device, timeout)
    for note in done.notes:
        print(f"opscan: {note}", file=sys.stderr)
    return done.findings, done.lines, ExitCode.OK if done.all_minimised else ExitCode.FINDINGS


def _check_device(device: str) -> None:
    """--minimize probes on --device: refuse one this machine cannot use, with repro's own fixes."""
    from opscan.probe.stage import ProbeEnvironmentError, check_device
    from opscan.repro import ReproError

    try:
        check_device(device)
    except ProbeEnvironmentError:
        raise ReproError(f"--minimize --device {device}: {device} is not available here (--minimize probes on it) "
                         f"— run it where {device} is, or pass --device cpu; without --minimize the scripts are "
                         f"written for {device} all the same") from None


main = Command(build_parser, _run, logs=False, prepare=False).main  # `opscan repro`: main(argv, ctx=None)
