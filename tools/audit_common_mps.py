#!/usr/bin/env python3
"""Audit every entry of every SUPPORTED_* / *XFAILLIST* / *SKIPLIST* list of PyTorch's common_mps.py, in each
release that ships it (2.8.0 on): does opscan's OpInfo map (opscan/knowledge/opinfo_map.txt) reach the aten ops the
entry stands for, and does the entry carry a comment that states a condition?

    python tools/audit_common_mps.py --wheels /work/wheels            # writes docs/common-mps-audit.md
    python tools/audit_common_mps.py --wheels /work/wheels --check    # compare with the shipped doc

The lists are read from each release's macOS arm64 wheel (the one index.txt names), parsed with `ast`, never
imported; the lists the knowledge base does not keep (UNDEFINED_XFAILLIST, ON_MPS_XFAILLIST, the SKIPLISTs, the
error-inputs XFAILLIST) are audited too. An entry reaches ops when:

* complex lists (SUPPORTED_COMPLEX_OPS, AFTER_MACOS_14_0_...): its complex64 samples dispatched an op with a complex
  tensor (the map's `dispatch` line), or the map attributes overloads to it, or an aten name spells it;
* other lists: the map attributes overloads to it (methods `name`, `samples`), or for an entry about complex64 only,
  its `dispatch` line.
No torch import.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from table_output import write_or_check  # noqa: E402
from opscan.knowledge.build import COMMON_MPS, read_wheel  # noqa: E402
from opscan.knowledge.common_mps import opinfo_candidates  # noqa: E402
from opscan.knowledge.entry import load_store  # noqa: E402
from opscan.knowledge.expectations import load_conditions  # noqa: E402
from opscan.knowledge.opinfo import load_opinfo_map  # noqa: E402
from opscan.knowledge.sources import _comments, _entry_comment  # noqa: E402
from opscan.opkey import Release  # noqa: E402

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "common-mps-audit.md")
APPLIED = {  # how dtype_rules.py uses each list
    "SUPPORTED_COMPLEX_OPS": "applied: `dtype-complex`",
    "AFTER_MACOS_14_0_SUPPORTED_COMPLEX_OPS": "applied from macOS 14.0: `dtype-complex`",
    "UNIMPLEMENTED_XFAILLIST": "applied: `dtype-xfail` (dtype entries; every-dtype entries only under a macOS gate)",
    "MACOS_BEFORE_14_4_XFAILLIST": "applied below macOS 14.4: `dtype-xfail` / `macos-gate`",
    "MACOS_BEFORE_15_0_XFAILLIST": "applied below macOS 15.0: `dtype-xfail` / `macos-gate`",
}
NOT_APPLIED = {  # why dtype_rules.py does not read a list (prefix match, longest first)
    "MACOS_BEFORE_13_3_XFAILLIST": "not applied: its comment says precision failures (fast-math)",
    "UNIMPLEMENTED_XFAILLIST_SPARSE": "not applied: sparse test variants (sparse calls: predict/sparse.py)",
    "UNDEFINED_XFAILLIST": "not applied: undefined or random results, not missing support",
    "ON_MPS_XFAILLIST": "not applied: MPS-vs-CPU result differences, not missing support",
    "XFAILLIST_GRAD": "not applied: the gradient test's list",
    "XFAILLIST": "not applied: the error-inputs test's list",
}


def _use(name: str) -> str:
    """How dtype_rules.py uses list `name`."""
    if name in APPLIED:
        return APPLIED[name]
    if name in NOT_APPLIED:
        return NOT_APPLIED[name]
    if "SKIP" in name:
        return "not applied: skipped tests"
    if name.endswith("_GRAD"):
        return NOT_APPLIED["XFAILLIST_GRAD"]
    return "not applied: not read by dtype_rules.py (a macOS-range list other than the gated two)"


def list_entries(text: str) -> list[tuple[str, str, str, str]]:
    """(list, key, dtypes or '*' or 'set', comment) for every entry of every list literal in a common_mps.py."""
    comments = _comments(text)
    out = []
    for node in ast.walk(ast.parse(text)):
        name, value = _target(node)
        if name is None or not any(w in name for w in ("SUPPORTED", "XFAIL", "SKIP")):
            continue
        if isinstance(value, ast.Set):
            out += [(name, e.value, "set", _entry_comment(comments, e.lineno, e.end_lineno))
                    for e in value.elts if isinstance(e, ast.Constant)]
        elif isinstance(value, ast.Dict):
            out += [(name, k.value, _dtypes(v), _entry_comment(comments, k.lineno, v.end_lineno))
                    for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)]
    return out


def _target(node):
    """(list name, literal) of `NAME = {...}`, `NAME: T = {...}` or `NAME.update({...})`, else (None, None)."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        return (target.id, node.value) if isinstance(target, ast.Name) else (None, None)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
            and isinstance(node.func.value, ast.Name) and node.args):
        return node.func.value.id, node.args[0]
    return None, None


def _dtypes(node) -> str:
    """'*' for None, else the dtype names (both branches of a macOS conditional)."""
    if isinstance(node, ast.Constant) and node.value is None:
        return "*"
    names = sorted({n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr != "torch"})
    return ",".join(names) or "-"


def reach(opinfo: str, list_name: str, dtypes: str, omap, spelled: set[str]) -> str | None:
    """None when the map reaches an op for the entry, else why not."""
    row = omap.rows.get(opinfo)
    if row is None:
        return "no OpInfo of that name in the recording release's op_db (renamed or removed)"
    dispatch = row.dispatched.get("complex64", ())
    if "COMPLEX" in list_name:
        if dispatch or row.overloads or opinfo in spelled:
            return None
        if "complex64" not in row.mps_dtypes:
            return "not tested in complex64 on MPS (its OpInfo's MPS dtypes lack complex64)"
        return "its complex64 samples dispatched no op with a complex tensor (or failed on the CPU)"
    if row.overloads or (dtypes == "complex64" and dispatch):
        return None
    if row.samples == 0:
        return "its samples failed on the CPU: nothing recorded"
    return "its samples dispatch only ops other OpInfos share too (map method `none`): it marks no op"


def audit(wheels: str) -> str:
    """The audit document's text."""
    omap = load_opinfo_map()
    spelled = {c for name in _yaml_names() for c in opinfo_candidates(name)}
    conditions = {(c.list, c.opinfo): c for c in load_conditions()}
    per_release, missing, notes = {}, defaultdict(list), defaultdict(list)
    for line in load_store().index:
        if Release.parse(line.release).numbers < (2, 8) or line.release in per_release:
            continue
        text = read_wheel(os.path.join(wheels, line.wheel)).common_mps if _has(wheels, line.wheel) else None
        if text is None:
            continue
        counts: Counter = Counter()
        for list_name, key, dtypes, comment in list_entries(text):
            why = reach(key, list_name, dtypes, omap, spelled)
            counts[(list_name, "entries")] += 1
            counts[(list_name, "every dtype")] += dtypes == "*"
            counts[(list_name, "reached" if why is None else "not reached")] += 1
            if why:
                missing[(list_name, key, why)].append(line.release)
            if comment and "SKIP" not in list_name:
                notes[(list_name, key, comment)].append(line.release)
        per_release[line.release] = counts
    return _render(per_release, missing, notes, conditions, omap)


def _has(wheels: str, name: str) -> bool:
    return os.path.isfile(os.path.join(wheels, name))


def _yaml_names() -> list[str]:
    from opscan.knowledge import load_knowledge

    return [name.split(".", 1)[0] for name in load_knowledge(release="2.14.1").yaml.raw]


def _span(releases: list[str]) -> str:
    """"2.8.0" or "2.8.0–2.14.1 (10)" (an entry in two functions' lists counts once per release)."""
    releases = list(dict.fromkeys(releases))
    return releases[0] if len(releases) == 1 else f"{releases[0]}–{releases[-1]} ({len(releases)})"


def _render(per_release, missing, notes, conditions, omap) -> str:
    lines = [
        "# Audit of common_mps.py's lists against opscan's OpInfo map",
        "",
        "Generated by `tools/audit_common_mps.py --wheels DIR` from the macOS arm64 wheels of every release that "
        f"ships `{COMMON_MPS}` (2.8.0 on; the wheels index.txt names), against `opinfo_map.txt` (recorded on torch "
        f"{omap.release}). Do not edit by hand. An entry *reaches* an aten op when the map attributes overloads to its "
        "OpInfo (for the complex lists: also the ops its complex64 samples dispatched with a complex tensor). An "
        "entry that reaches none carries no expectation onto any op of a trace. Entries for every dtype (`None`) "
        "of UNIMPLEMENTED_XFAILLIST are applied only under a macOS gate (otherwise the yaml decides), and an entry "
        "whose comment states a condition only to calls that meet it (last section). How the lists become verdicts: "
        "[knowledge-base.md](knowledge-base.md#dtype-expectations); back to the [README](../README.md).",
        "",
        "## Per release and list",
        "",
        "| release | list | how opscan uses it | entries | of which for every dtype | reach an op | reach none |",
        "|---|---|---|---|---|---|---|",
    ]
    for release, counts in per_release.items():
        for name in sorted({n for n, _ in counts}):
            lines.append(f"| {release} | `{name}` | {_use(name)} | {counts[(name, 'entries')]} | "
                         f"{counts[(name, 'every dtype')]} | {counts[(name, 'reached')]} | "
                         f"{counts[(name, 'not reached')]} |")
    lines += ["", "## Entries that reach no op, and why", "",
              "| list | OpInfo | why | releases |", "|---|---|---|---|"]
    for (name, key, why), releases in sorted(missing.items()):
        lines.append(f"| `{name}` | `{key}` | {why} | {_span(releases)} |")
    lines += ["", "## Entries whose comment may state a condition", "",
              "Each commented entry of the xfail lists, with the condition opscan applies "
              "(`expectation_conditions.yaml`), or none: a comment that names a cause (precision, a CPU error, "
              "a missing kernel) without restricting the call's form gives no condition.", "",
              "| list | OpInfo | comment | condition applied | releases |", "|---|---|---|---|---|"]
    for (name, key, comment), releases in sorted(notes.items()):
        cond = conditions.get((name, key))
        applied = f"`{cond.when}`" if cond is not None and cond.comment == comment else "—"
        lines.append(f"| `{name}` | `{key}` | {comment.replace('|', '/')} | {applied} | {_span(releases)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) docs/common-mps-audit.md."""
    p = argparse.ArgumentParser(prog="audit_common_mps.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", required=True, help="folder holding the wheels index.txt names")
    p.add_argument("--check", action="store_true", help="compare with the shipped doc instead of writing")
    p.add_argument("--output", default=DOC)
    args = p.parse_args(argv)
    return write_or_check("audit_common_mps", args.output, audit(args.wheels), args.check)


if __name__ == "__main__":
    sys.exit(main())
