"""Write docs/silent-bugs.md: the knowledge base of MPS silent-correctness bugs (opscan/knowledge/silent_bugs.yaml),
its measured recall (tools/silent/recall.json, written by tools/silent/recall.py), the triage's searches and every
triaged report with its outcome and reason (tools/silent/triage.yaml).

    python tools/silent_bugs_doc.py [--check]

--check exits 1 when the page on disk differs from what this writes (tests/test_silent_doc.py runs it).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRIAGE = ROOT / "tools" / "silent" / "triage.yaml"
RECALL = ROOT / "tools" / "silent" / "recall.json"
DOC = ROOT / "docs" / "silent-bugs.md"

HEAD = """# Known MPS silent-correctness bugs

[README](../README.md) · [all docs](../README.md#documentation) · related: [Knowledge base](knowledge-base.md), \
[Measured mode](measured-mode.md), [Report schema](report-schema.md)

<!-- written by tools/silent_bugs_doc.py from opscan/knowledge/silent_bugs.yaml and tools/silent/triage.yaml -->

A step can run on MPS and return wrong numbers. opscan keeps the bugs of that kind that PyTorch's own issue threads
and regression tests document as data (`opscan/knowledge/silent_bugs.yaml`, {entries} entries): per entry the ops
(as MPS dispatches them), the condition on a call's arguments (in the `when` language of kernel_rules.yaml, extended
with `.stride`, `.storage_offset`, `.device`, `.requires_grad`, `.itemsize`, `.is_contiguous`,
`.is_channels_last_contiguous`, `.looks_channels_last`, `.max_elem_offset`, and the names `result` and `chip`), the
releases affected and the fixing release (or *open*), the macOS range and chip families it is limited to, the issue
and the fixing PR, the workaround, and how its releases were established.

**The verdict.** A traced call that meets an entry's condition, in a release the entry affects and on the assumed
macOS, is predicted `mismatch` (rule `silent-bug-<id>`, `source: predicted`): it ranks and decides like any
`mismatch` (lane `linux-gpu-first`, `--fail-on error` fails on it), its row's `since` and the upgrade advice name the
fixing release, its remedy the workaround and the modules that make the call, and its row's `silent` section lists
the calls that meet the condition. An entry limited to some chips decides only with `--chip` (`OPSCAN_CHIP`);
without it, and when only the assumed macOS (the release's minimum, not a `--macos` given) keeps an entry off, the
row stays as it was and its evidence carries a note. `opscan coverage --op PATTERN` lists the entries of the
matching ops per release. Measured mode probes a call meeting a size condition at its real size (the element cap is
lifted for it, and its note says so), keeps every recorded stride, storage offset and CPU operand, and so do the
repro scripts; measured on a Mac that does not reproduce an entry, the row keeps both and `silent.not_reproduced`
names the macOS and chip.

**How the releases were established.** Against PyTorch's release calendar (tools/silent/releases.yaml: each
series' branch cut and release day, from the release-tracker issues), by rules tools/silent/establish.py applies
and checks: the fixing release is the first whose branch was cut after the fixing PR merged (an entry's
`fix_merged`; a merge on the cut's own day counts for the next release), unless the thread shows a cherry-pick into
an earlier branch or a maintainer names the release. The first affected release is the release that shipped the
change named as the cause (e.g. #128393, the strided MPSNDArray API of 2.5 behind several macOS-15-only bugs), or
the first release whose wheel gives the op an MPS kernel (opscan's per-release records), else the earliest release a
reporter verified, else the release current on the day it was reported (`reported`). Where the fixing PR was not
read, the fix is taken as landed before the first branch cut after the report (the regression test that cites the
issue shows a fix landed) and the entry says so, with low confidence. A regression test with no issue is dated by
the PR that added it (the entry's id is then the test's name or the PR's number). Confidence: `high` where the merge
day (or the wheel's own binary) settles the release against the cut; `medium` where the fixing PR was read and opened
days to weeks before the cut, or its cherry-pick was asked for, but its merge was not seen; `low` where the fixing PR
was not read, or a release boundary rests on the day of a report alone. Each entry's `established` says which rule
gave what, and `confidence` how sure it is ({confidence}). Patch releases of an affected series are taken as
affected unless a cherry-pick was seen.

**What no entry can promise.** The base holds only bugs someone reported or a regression test pinned: a clean row
means "no known entry matches", not "correct" — most MPS silent bugs were found by users months after a release.
Value-, state- and timing-dependent bugs (allocator history, graph-cache reuse, non_blocking copies, NaN or
duplicate indices) cannot be predicted from a trace; Apple can fix or bring back a bug with a macOS update and no
torch release (#180201 came back on the macOS 27 beta); a release boundary inferred from a merge date can be off by
one release; a threshold is the one reported, and a bug reported at 2**32 elements may start earlier for other
shapes. Measured mode on a real Apple Silicon Mac is the check; a virtual Mac (GitHub's hosted macOS runners) is
not one, and its measurements never stand for MPS.

**Settling an entry on a Mac.** tools/silent/probe_set.py is a target whose step makes the reporters' repro calls
of the entries a measurement can decide (its `SETTLE` names each entry and the torch releases and macOS to run it
on): `opscan bundle tools/silent/probe_set.py:forward_set --inference` and `... :training_set`, run on the Mac once
per release in question ([bundle.md](bundle.md)); a `mismatch` where an entry says clean, or a clean row where it
says affected, corrects the entry.

**Where the trace and MPS differ.** The conditions read strides and offsets recorded on the CPU. A tensor the step
is given (parameters, buffers, inputs) is copied to MPS by `.to("mps")`, which starts it at offset 0, so offsets are
counted from where it starts; a tensor that stays on the CPU on a Mac — one that existed before the step without
being given (a scheduler's `sigmas`), one a Python factory made without `device=`, or one made only from such
tensors — is recorded as `host` (the condition's `.device == 'cpu'`). Fresh outputs take the same layout on both
devices (both use TensorIterator's and `empty_like`'s rules), with known exceptions the entries do not read: a
convolution's output memory format (MPS returns channels_last when the input *or the weight* is channels_last from
#162776 on, the CPU when the input is), and `.to("mps")` of a non-dense CPU input (contiguous on MPS). The lens's
high-level calls (linear, attention) carry their own arguments' strides, offsets and requires_grad.

## Entries ({entries})

| id | ops | condition | reported | affected | fixed | macOS / chip | confidence |
|---|---|---|---|---|---|---|---|
"""


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


OUTCOMES = {
    "entry": "one of the entries above (duplicates and companion issues folded into theirs)",
    "not an entry": "encodable, but kept out for the reason given (an unconfirmed claim, a limit of the binder or "
                    "of another rule, or a regression test whose origin no search found)",
    "not encodable": "no condition on a traced call decides it (value-, state- or timing-dependent, an unclear "
                     "condition, a property the trace does not record)",
    "out of scope": "not silent (an error or a crash), fixed before 2.0.0, never shipped in a release, or not MPS",
}


def render() -> str:
    from opscan.knowledge.silent_bugs import load_bugs

    bugs = load_bugs()
    data = yaml.safe_load(TRIAGE.read_text(encoding="utf-8"))
    triage = data["records"]
    confidence = Counter(b.confidence for b in bugs)
    head = HEAD.replace("{entries}", str(len(bugs))).replace(
        "{confidence}", ", ".join(f"{confidence[c]} {c}" for c in ("high", "medium", "low")))
    lines = [head.rstrip("\n")]
    for b in bugs:
        when = "; ".join(f"`{op}`: `{w}`" for op, w in b.when.items()) if len(set(b.when.values())) > 1 \
            else f"`{next(iter(b.when.values()))}`"
        gate = ", ".join(p for p in (b.macos_text, "/".join(b.chip) if b.chip else None) if p) or "any"
        issue = _entry_link(b)
        fix = f" (PR #{b.fix_pr})" if b.fix_pr else ""
        lines.append(f"| {issue} | {', '.join(b.ops)} | {_cell(when)} | {b.reported} | {b.first} – {b.last}.x | "
                     f"{b.fixed}{fix} | "
                     f"{gate} | {b.confidence} |")
    lines += _recall()
    counts = Counter(r["outcome"] for r in triage)
    lines += ["", f"## Triage ({len(triage)} reports)", "",
              "Every `pytorch/pytorch` issue, PR and `test/test_mps.py` regression test read for this knowledge base "
              "(the research trail is in tools/silent/triage.yaml):", "",
              "| outcome | reports | meaning |", "|---|---|---|"]
    lines += [f"| {k} | {counts[k]} | {v} |" for k, v in OUTCOMES.items()]
    lines += ["", _releases_paragraph(triage)]
    searches = data.get("searches") or []
    lines += ["", f"The searches of the latest triage ({len(searches)}; the first triage's were not recorded), with "
              "the number of results each returned, so that the next triage can diff:", "",
              "| corpus | results | query |", "|---|---|---|"]
    lines += [f"| {q['corpus']} | {q['count']} | {_cell(q['query'])} |" for q in searches]
    lines += ["", "| id | title | outcome | releases | reason |", "|---|---|---|---|---|"]
    for r in triage:
        link = f"[{r['id']}]({r['url']})" if r.get("url") else r["id"]
        reason = _clip(_cell(r.get("reason") or f"entry {r.get('entry')}"), 300) + _condition(r)
        lines.append(f"| {link} | {_cell(r['title'])} | {r['outcome']} | {_releases(r)} | {reason} |")
    return "\n".join(lines) + "\n"


def _releases_paragraph(triage) -> str:
    """How many reports that are not entries carry their releases, and how many could not be dated."""
    dated = [r for r in triage if r["outcome"] != "entry" and r.get("confidence")]
    known = Counter(r["confidence"] for r in dated if r.get("affected"))
    unknown = [r for r in dated if not r.get("affected")]
    return (f"Releases of the reports that are not entries: {sum(known.values())} carry the releases established for "
            f"them by the same rules as the entries' ({', '.join(f'{known[c]} {c}' for c in ('high', 'medium', 'low'))}"
            " confidence; `reported`, `affected`, `fixed_in`, `macos`, `established` and `confidence` in triage.yaml, "
            f"the `releases` column below); {len(unknown)} are regression tests whose origin no search found, so no "
            "release of a bug behind them could be established: each one's `established` names what was searched. "
            "A report whose condition is unclear or value-dependent stays out for that reason, not for its releases.")


def _releases(record) -> str:
    """A triage record's releases: first - last affected, the macOS range, the fixing release and the confidence."""
    if not record.get("confidence"):
        return ""
    if not record.get("affected"):
        return f"not found (see `established`; {record['confidence']})"
    first, last = record["affected"]
    macos = record.get("macos")
    gate = f", macOS {macos[0]}–{macos[1] or ''}" if macos else ""
    fixed = record.get("fixed_in") or (f"macOS {macos[1]}" if macos and macos[1] else "—")
    return f"{first} – {last}.x{gate}; fixed {fixed} ({record['confidence']})"


def _clip(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis where it was longer (triage.yaml has the whole)."""
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _condition(record) -> str:
    """The `when` a record would have as an entry, when it names one."""
    when = record.get("when")
    if not when:
        return ""
    text = "; ".join(f"`{op}`: `{w}`" for op, w in when.items()) if isinstance(when, dict) else f"`{when}`"
    return f"; condition: {_cell(text)}"


def _recall() -> list[str]:
    """The recall section, from tools/silent/recall.json (tools/silent/recall.py --write)."""
    import json

    result = json.loads(RECALL.read_text(encoding="utf-8"))
    lines = ["", "## Recall, measured", "",
             f"Would the entries known before a day D have predicted the bugs reported after it? With D = "
             f"{result['day']}: the {result['base']} entries reported before D form the base, and each of the "
             f"{result['held_out']} entries reported on or after D is a held-out bug whose reporter's repro "
             "(tests/targets/silent_repros.py) is scanned against that base alone (`python tools/silent/recall.py "
             f"{result['day']} --write`). **{result['predicted']} of {result['held_out']}** are predicted "
             f"(a row decided by an earlier entry), {result['noted_only']} more only as a note (an earlier entry "
             "that meets the call on another macOS or chip). Silent bugs rarely repeat: each lives in one kernel's "
             "own index arithmetic or layout handling, so an entry generalises to the next bug only when the same "
             "kernel breaks again in the same way. The base predicts the bugs it holds (every entry is tested "
             "against its reporter's repro); it is no detector of the next one, and a clean row stays \"no known "
             "entry matches\".", "", "| held-out bug | reported | predicted by |", "|---|---|---|"]
    from opscan.knowledge.silent_bugs import load_bugs

    links = {b.id: _entry_link(b) for b in load_bugs()}
    for h in result["bugs"]:
        by = ", ".join(map(_ref, h["predicted_by"])) or (
            "note: " + ", ".join(map(_ref, h["noted_by"])) if h["noted_by"] else "—")
        lines.append(f"| {links.get(h['id'], _ref(h['id']))} {_cell(h['title'])} | {h['reported']} | {by} |")
    return lines


def _ref(entry_id: str) -> str:
    """An entry named in text: #<issue> for an issue number, else its id (a regression test's name)."""
    return f"#{entry_id}" if entry_id.isdigit() else entry_id


def _entry_link(bug) -> str:
    """An entry's first issue as a link; an entry from a PR (no issue) links that PR (its id or its fix)."""
    if bug.issues:
        return f"[#{bug.issues[0]}](https://github.com/pytorch/pytorch/issues/{bug.issues[0]})"
    pr = bug.id if bug.id.isdigit() else bug.fix_pr
    return f"[PR #{pr}](https://github.com/pytorch/pytorch/pull/{pr}) ({bug.id})" if pr else bug.id

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/silent-bugs.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        return 0 if current == text else 1
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
