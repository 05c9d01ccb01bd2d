"""Report: the drifted C++ composites the zoo's traces run, release by release (issue 24 (b), docs/release-drift.md).

For each model of bench/zoo.yaml (or --only NAME ...), the step is traced as opscan/zoo/releases.py does (one trace
per distinct set of answers to the trace's questions) and every covered release is judged twice: as opscan does
(the composites the trace ran judged by that release's kernels, predict/release_paths.py) and with that rule off
(the installed torch's C++ paths). It prints, per model, each composite the trace ran whose kernel differs in some
release, what happened to it in which releases (`changed`: rows judged by the release's callees; `unjudged`: the
release's extra callees sit on branches the step did not take; `unknown`: not known), and the cells whose result
(lane or blocking rows) the rule changes:

    python bench/release_drift.py --only vision_transformer bert > /tmp/drift.md

`--paths-only` judges nothing: per model and release it builds the view the release's C++ composites make
(predict/release_paths.py) and the Python paths (predict/python_paths.py) on the same traces, so it lists the
drifted composites (the cells column says "not computed") and then, for the Python half, every torch function the
traces executed whose code differs in some release, with what covers it per release: an earlier_paths fact, a
reviewed same-ops class, a missing API (rule missing-api), or nothing (said in the scans' evidence and notes;
"not in py_drift.txt" when the table does not hold the function). Seconds per model instead of minutes:

    python bench/release_drift.py --paths-only --only resnet18 bert > /tmp/drift.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from zoo import options_of  # noqa: E402

_NOTE = re.compile(r"^(release-callees(?:-unknown)?): (.*)$")


def judge_model(options) -> tuple[dict, dict, float]:
    """({release: notes}, {release: (with the rule, without it)} ReleaseResults, seconds) of one model."""
    from opscan import scan as scan_module
    from opscan.knowledge import kb_releases, load_knowledge
    from opscan.zoo.releases import result_of, trace_serving

    base = replace(options, memory=False, torch_version=None)
    traced, notes, results = [], {}, {}
    start = time.perf_counter()
    for release in kb_releases():
        kb = load_knowledge(release=release)
        index = trace_serving(traced, kb, replace(base, torch_version=release))
        prepared = replace(traced[index][0], kb=kb)
        with_rule = scan_module.scan(replace(base, torch_version=release), prepared=prepared)
        notes[release] = [n for n in with_rule.assumptions["notes"] if _NOTE.match(n)]
        real = scan_module.for_release
        scan_module.for_release = lambda p: p  # the rule off: the installed torch's C++ paths
        try:
            without = scan_module.scan(replace(base, torch_version=release), prepared=prepared)
        finally:
            scan_module.for_release = real
        results[release] = (result_of(with_rule, release), result_of(without, release))
    return notes, results, time.perf_counter() - start


def paths_model(options) -> tuple[dict, dict, float]:
    """({release: C++ notes}, {unit: {kind: [releases]}}, seconds) of one model, from its traces alone."""
    from opscan.knowledge import kb_releases, load_knowledge
    from opscan.knowledge.py_drift import installed_hash, load_py_drift, same_ops
    from opscan.predict.python_paths import release_paths
    from opscan.predict.release_paths import release_view
    from opscan.zoo.releases import trace_serving

    base = replace(options, memory=False, torch_version=None)
    traced, notes, units = [], {}, defaultdict(lambda: defaultdict(list))
    table = load_py_drift()
    start = time.perf_counter()
    for release in kb_releases():
        kb = load_knowledge(release=release)
        index = trace_serving(traced, kb, replace(base, torch_version=release))
        trace, view = traced[index][0].trace, traced[index][0].view
        view, cxx = release_view(trace, view, kb)
        notes[release] = [n for n in cxx if _NOTE.match(n)]
        paths = release_paths(trace, view, kb)
        facts = {f.from_unit for f in paths.origin if f} | {f.via for f in paths.origin if f and f.via}
        for unit in dict.fromkeys(u for chain in set(paths.chains) for u in chain):
            if not table.covers(unit, release):
                kind = "not in py_drift.txt"
            elif table.hash_in(unit, release) == installed_hash(unit):
                continue
            elif unit in paths.missing:
                kind = "missing API"
            elif unit in paths.drifted:
                kind = "said in the scans"
            elif unit in facts:
                kind = "fact"
            elif same_ops(unit, table.hash_in(unit, release), installed_hash(unit)):
                kind = "same ops"
            else:
                kind = "AMP table"  # torch/amp/grad_scaler.py: the AutocastMPS table models it (python_paths.py)
            units[unit][kind].append(release)
    return notes, units, time.perf_counter() - start


PY_KINDS = ("fact", "same ops", "missing API", "AMP table", "said in the scans", "not in py_drift.txt")


def _journal(path: str) -> dict:
    """name -> (notes, units, seconds) of a --journal file (a torn line is skipped)."""
    out = {}
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            out[row["name"]] = (row["notes"], row["units"], row["seconds"])
    return out


def _now(unit: str, kind: str, release: str) -> str:
    """A journaled kind as the review reads today (a same-ops class added since the journal was written)."""
    from opscan.knowledge.py_drift import installed_hash, load_py_drift, same_ops

    table = load_py_drift()
    if kind == "said in the scans" and table.covers(unit, release) and \
            same_ops(unit, table.hash_in(unit, release), installed_hash(unit)):
        return "same ops"
    return kind


def print_units(found: dict[str, dict[str, dict[str, list[str]]]]) -> None:
    """The Python half's table: unit -> the models that ran it, and per kind the releases."""
    print("\n| function | models | " + " | ".join(PY_KINDS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in PY_KINDS) + " |")
    for unit, by_model in sorted(found.items()):
        kinds = defaultdict(set)
        for what in by_model.values():
            for kind, releases in what.items():
                for release in releases:
                    kinds[_now(unit, kind, release)].add(release)
        models = sorted(by_model)
        shown = ", ".join(models[:4]) + (f" +{len(models) - 4}" if len(models) > 4 else "")
        cells = " | ".join(_runs(sorted(kinds[k])) or "-" for k in PY_KINDS)
        print(f"| `{unit}` | {shown} | {cells} |")
    uncovered = sorted(u for u, by in found.items() if any(
        _now(u, k, r) in ("said in the scans", "not in py_drift.txt") for w in by.values() for k, rs in w.items()
        for r in rs))
    print(f"\n{len(found)} torch functions the traces ran whose code differs in some release or that py_drift.txt "
          f"does not hold; {len(uncovered)} not covered by a fact or a review in some release (said in those scans' "
          f"evidence and notes): {', '.join(uncovered) or 'none'}")


def composites(notes: dict) -> dict[str, dict[str, list[str]]]:
    """composite -> {what (changed, unjudged, unknown): [releases]} from the notes."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for release, lines in notes.items():
        for line in lines:
            rule, text = _NOTE.match(line).groups()
            if rule.endswith("unknown"):
                op = text.split("C++ kernel of ", 1)[1].split(" calls", 1)[0]
                out[op]["unknown"].append(release)
                continue
            kind = "unjudged" if "not judged" in text else "changed"
            listed = text.split("not judged: ", 1)[1] if kind == "unjudged" else \
                text.split("judged by", 1)[1].split(": ", 1)[1]
            for part in listed.split("; "):
                out[part.split(":", 1)[0]][kind].append(release)
    return out


def _cell(result) -> tuple:
    """What a leaderboard cell shows: the lane, native or not, the blocking (op, verdict) pairs."""
    return result.lane, result.native, sorted({(b.op, b.verdict) for b in result.blocking})


def _blocking(result) -> str:
    ops = sorted({b.op.removeprefix("aten::") for b in result.blocking})
    return f" [{', '.join(ops)}]" if ops else ""


def _runs(releases: list[str]) -> str:
    from opscan.knowledge import kb_releases

    order = kb_releases()
    runs: list[list[str]] = []
    for r in sorted(releases, key=order.index):
        if runs and order.index(runs[-1][-1]) + 1 == order.index(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(BENCH / "zoo.yaml"))
    parser.add_argument("--only", nargs="*", help="only these entries")
    parser.add_argument("--paths-only", action="store_true", help="the drifted composites and Python functions only")
    parser.add_argument("--journal", help="with --paths-only: keep each model's paths in this file (JSON lines) and "
                        "take the models it already holds from it")
    args = parser.parse_args(argv)
    done = _journal(args.journal) if args.journal else {}
    manifest = yaml.safe_load(Path(args.manifest).read_text(encoding="utf-8"))
    models = {name: {**manifest.get("defaults", {}), **entry} for name, entry in manifest["models"].items()
              if not args.only or name in args.only}
    print("| model | composite (drifted) | judged by the release's callees | extra callees, unjudged | "
          "not known | cells changed (release: without -> with) |")
    print("| --- | --- | --- | --- | --- | --- |")
    total = changed_cells = other_cells = 0
    python: dict = defaultdict(dict)
    for name, entry in models.items():
        try:
            if args.paths_only and name in done:
                notes, units, seconds = done[name]
            elif args.paths_only:
                notes, units, seconds = paths_model(options_of(entry))
                if args.journal:
                    with open(args.journal, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps({"name": name, "notes": notes, "units": units, "seconds": seconds}) + "\n")
            if args.paths_only:
                for unit, what in units.items():
                    python[unit][name] = what
                results = {}
            else:
                notes, results, seconds = judge_model(options_of(entry))
        except Exception as exc:  # noqa: BLE001 - a model that fails is a line
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:100]} | | | | |", flush=True)
            continue
        cells = [f"{r}: {old.lane}{_blocking(old)} -> {new.lane}{_blocking(new)}"
                 for r, (new, old) in results.items() if _cell(new) != _cell(old)]
        rows_only = sum(1 for new, old in results.values() if new != old and _cell(new) == _cell(old))
        total += len(results)
        changed_cells += len(cells)
        other_cells += rows_only
        shown = ("; ".join(cells) or "-") + (f" (+{rows_only} rows only)" if rows_only else "")
        shown = "not computed" if args.paths_only else shown
        found = composites(notes) or {"-": {}}
        for i, (op, what) in enumerate(sorted(found.items())):
            print(f"| {name if i == 0 else ''} | {op} | {_runs(what.get('changed', [])) or '-'} | "
                  f"{_runs(what.get('unjudged', [])) or '-'} | {_runs(what.get('unknown', [])) or '-'} | "
                  f"{shown if i == 0 else ''} |", flush=True)
        print(f"release_drift: {name} {seconds:.0f} s", file=sys.stderr, flush=True)
    if args.paths_only:
        print_units(python)
        return 0
    print(f"\n{len(models)} models, {total} cells: release-callees changes the lane or the blocking rows of "
          f"{changed_cells}, only the rows' list or evidence of {other_cells} more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
