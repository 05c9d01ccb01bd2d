#!/usr/bin/env python3
"""Every runtime check of the MPS kernels decided (issue 38): the CPU twins read from the dylibs, and the table of
docs/knowledge-base.md.

    python tools/kernel_decisions.py twins --dylib-dir DIR      # rewrite opscan/knowledge/kernel_cpu_twins.txt
    python tools/kernel_decisions.py table                      # print the decisions table
    python tools/kernel_decisions.py table --write              # put it into docs/knowledge-base.md
    python tools/kernel_decisions.py table --check              # exit 1 when the doc's table differs
    python tools/kernel_decisions.py list [--reason R]          # every check with its decision, one a line

`twins` reads each release's libtorch_cpu.dylib in DIR (DIR/<release>/torch/lib/libtorch_cpu.dylib; releases absent
are skipped and named in the file's header) with tools/macho_checks.py, keeping every failure call of any source
file, and records each kernel check whose message (spaces aside) is also the message of a check of non-MPS code in a
release that has it: the op validates that argument the same on the CPU (reason same-as-cpu). Messages of
AT_DISPATCH's generic "not implemented for '...'" are never twins (the type lists differ). About a minute a dylib on
two cores. The decisions themselves are opscan/knowledge/kernel_decisions.py and kernel_decisions.yaml.
Exit codes: 0 done, 1 --check found a difference, 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "knowledge-base.md")
BEGIN = "<!-- kernel-decisions:begin (tools/kernel_decisions.py table --write) -->"
END = "<!-- kernel-decisions:end -->"
GENERIC = ("not implemented for '", "(no message)")
DYLIB = "torch/lib/libtorch_cpu.dylib"


def _norm(message: str) -> str:
    return " ".join(message.split())


def shared_messages(data: bytes) -> set[str]:
    """The messages of every check of non-MPS source files in one dylib (normalized)."""
    import macho_checks

    keep = macho_checks._concerns_mps
    macho_checks._concerns_mps = lambda path, message: True  # every source file: the twins are the non-MPS ones
    try:
        sites = macho_checks.find_sites(data, macho_checks.load(data))
    finally:
        macho_checks._concerns_mps = keep
    out = set()
    for site in sites:
        if site.macro != "TORCH_WARN" and "/mps/" not in site.file:
            out.add((_norm(" … ".join(p for p in site.parts if p != "operator()")), site.file.rsplit("/", 1)[-1]))
    return out


def twins_text(checks, per_release: dict[str, set], missing: list[str]) -> str:
    """kernel_cpu_twins.txt for `checks`, from {release: shared_messages()}."""
    by_message: dict[str, dict[str, set]] = {}
    for release, pairs in per_release.items():
        for message, file in pairs:
            by_message.setdefault(message, {}).setdefault(release, set()).add(file)
    rows = []
    for check in checks.checks:
        text = _norm(check.message)
        if any(g in check.message for g in GENERIC) or len(text) < 16 or text not in by_message:
            continue
        files = {f for release in check.releases for f in by_message[text].get(release, ())}
        if files:
            rows.append(f"{check.id}\t{','.join(sorted(files))}")
    read = [r for r in checks.releases if r in per_release]
    header = ["# opscan: kernel checks whose message is also the message of a check of non-MPS (CPU or shared) code in",
              "# the libtorch_cpu.dylib of a release that has it: ID, then those source files. Written by",
              "# tools/kernel_decisions.py twins; read by opscan/knowledge/kernel_decisions.py (reason same-as-cpu).",
              f"# releases read: {', '.join(read)}" + (f"; not read: {', '.join(missing)}" if missing else "")]
    return "\n".join(header + sorted(rows)) + "\n"


def _twins(args) -> int:
    from opscan.knowledge.kernel_checks import load_checks
    from opscan.knowledge.kernel_decisions import TWINS_PATH

    checks = load_checks()
    per_release, missing = {}, []
    for release in checks.releases:
        path = os.path.join(args.dylib_dir, release, DYLIB)
        if not os.path.isfile(path):
            missing.append(release)
            continue
        with open(path, "rb") as fh:
            per_release[release] = shared_messages(fh.read())
        print(f"kernel_decisions: read {release}", file=sys.stderr)
    if not per_release:
        print(f"kernel_decisions: no dylib under {args.dylib_dir}", file=sys.stderr)
        return 2
    with open(TWINS_PATH, "w", encoding="utf-8") as fh:
        fh.write(twins_text(checks, per_release, missing))
    return 0


def doc_with_table(doc: str, table: str) -> str:
    """`doc` with the text between the markers replaced by `table` (ValueError without the markers)."""
    head, sep, rest = doc.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{DOC} lacks the markers {BEGIN!r} … {END!r}")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def _table(args) -> int:
    from opscan.knowledge.kernel_decisions import decision_table

    table = decision_table()
    if not (args.write or args.check):
        print(table, end="")
        return 0
    with open(DOC, encoding="utf-8") as fh:
        doc = fh.read()
    new = doc_with_table(doc, table)
    if args.check:
        if new != doc:
            print("kernel_decisions: docs/knowledge-base.md's table is out of date (run table --write)")
            return 1
        return 0
    with open(DOC, "w", encoding="utf-8") as fh:
        fh.write(new)
    return 0


def _list(args) -> int:
    from opscan.knowledge.kernel_decisions import decide_all

    for check, decision in sorted(decide_all().values(), key=lambda cd: (cd[1].status, cd[0].id)):
        if args.reason in (None, decision.status):
            print(f"{check.id}\t{check.kind}\t{decision.status}\t{check.message[:100]}\t{decision.text}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    twins = sub.add_parser("twins", help="rewrite kernel_cpu_twins.txt from the releases' dylibs")
    twins.add_argument("--dylib-dir", required=True)
    table = sub.add_parser("table", help="the decisions table of docs/knowledge-base.md")
    table.add_argument("--write", action="store_true")
    table.add_argument("--check", action="store_true")
    listing = sub.add_parser("list", help="every check with its decision")
    listing.add_argument("--reason")
    args = parser.parse_args(argv)
    return {"twins": _twins, "table": _table, "list": _list}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
