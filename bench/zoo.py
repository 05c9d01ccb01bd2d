"""Benchmark: opscan's predicted verdicts and lanes on a zoo of real architectures (bench/zoo.yaml).

Each entry of the manifest is scanned in this process, as `opscan TARGET` would (opscan.scan.scan with the
entry's arguments, inputs, mode, dtype and torch release; no probes, no memory estimate): tiny configs, random
weights, nothing downloaded. Per model it prints the seconds the scan took, the report's rows, unknown rows,
non-native rows and the predicted lane, and checks them against what the manifest says is true on MPS:

- `lane`: the lane MPS really earns (every non-native row explained below, with its source);
- `non_native`: the non-native rows as "op verdict" keys of the manifest's `reasons` table, each a one-line
  reason why the row is true, with its source;
- `known_wrong`: set on an entry whose predicted lane is known to be wrong (the reason says why); its lane
  check is reported, not counted. `known_wrong_rows` / `known_missed_rows` ("op verdict" -> why): rows opscan
  predicts that are not true, and true rows (in `non_native` like every true row) it does not predict, each
  naming the pending fix; they are reported, not counted, and a noted row that the run no longer gets wrong is
  listed (`zoo_known_wrong_fixed`);
- `domain`, `expected_before_run` ({lane, non_native, why}: what was written, with its sources, before opscan
  first ran on the model) and `expectation_fixed` (why the settled `lane`/`non_native` differ from it): issue
  25's record of expectation against result, shown in the table's "expected before run" column.

A model is a mismatch when its lane differs from `lane` (and it is not known-wrong), when a non-native row is
not among its `non_native` keys, or when an expected one is gone. The last line is the headline:

    python bench/zoo.py [--manifest bench/zoo.yaml] [--only NAME ...] [--markdown] [--journal FILE] [--reuse]
                        [--reports DIR]
    ...
    zoo_mismatches: 0 models

`--markdown` prints docs/zoo-table.md's table and its reasons instead of the plain one. `--journal FILE` appends
each model's result to FILE (one JSON line, as it finishes); with `--reuse` the models FILE already holds are not
scanned again but judged against the current manifest (editing the manifest's notes after a long run re-renders
the table without rescanning). Exit status 1 on a mismatch or a scan that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass
class Result:
    """One model's scan, set against its manifest entry."""

    name: str
    entry: dict
    seconds: float = 0.0
    rows: int = 0
    unknown: int = 0
    non_native: list[str] = field(default_factory=list)  # "op verdict" keys
    lane: str = ""
    error: str | None = None

    @property
    def problems(self) -> list[str]:
        if self.error:
            return [f"scan failed: {self.error}"]
        expected = set(self.entry.get("non_native", []))
        found = set(self.non_native)
        wrong, missed = set(self.entry.get("known_wrong_rows", {})), set(self.entry.get("known_missed_rows", {}))
        out = [f"unexplained: {k}" for k in sorted(found - expected - wrong)]
        out += [f"expected but gone: {k}" for k in sorted(expected - found - missed)]
        if self.lane != self.entry.get("lane") and not self.entry.get("known_wrong"):
            out.append(f"lane {self.lane}, true lane {self.entry.get('lane')}")
        return out

    @property
    def fixed(self) -> list[str]:
        """Known-wrong rows opscan no longer gets wrong (a fix landed: the manifest's note can go)."""
        wrong = set(self.entry.get("known_wrong_rows", {})) - set(self.non_native)
        missed = set(self.entry.get("known_missed_rows", {})) & set(self.non_native)
        lane = ["lane"] if self.entry.get("known_wrong") and self.lane == self.entry.get("lane") else []
        return [] if self.error else sorted(wrong | missed) + lane

    @property
    def expectation(self) -> str:
        """The lane and rows written before opscan first ran on the model (issue 25), set against the run:
        `=` the run agrees, else what differed."""
        before = self.entry.get("expected_before_run")
        if not before or self.error:
            return ""
        rows = set(before.get("non_native", []))
        diff = [f"+{k}" for k in sorted(set(self.non_native) - rows)]
        diff += [f"-{k}" for k in sorted(rows - set(self.non_native))]
        lane = before.get("lane")
        head = f"{lane}" + ("" if lane == self.lane else f" (run: {self.lane})")
        return head + (": " + ", ".join(diff) if diff else " =")


def options_of(entry: dict):
    """The manifest entry as ScanOptions (the shape a later `opscan zoo` can reuse)."""
    from opscan.scan import ScanOptions

    target = entry["target"]
    if target.startswith("bench/"):
        target = str(ROOT / target)
    return ScanOptions(target, inputs=tuple(entry.get("inputs", ())), args=dict(entry.get("args", {})),
                       inference=entry.get("mode", "train") == "inference", dtype=entry.get("dtype"),
                       torch_version=entry.get("torch_version"), memory=False, fx=False)


def canonical_report(report) -> str:
    """The report as sorted JSON without what differs between runs of one commit (the environment, timings):
    two commits' reports of one model compare equal exactly when they say the same (issue 37's byte check)."""
    data = report.to_dict()
    data.pop("environment", None)
    data.pop("opscan_version", None)
    return json.dumps(data, sort_keys=True, indent=1, default=str) + "\n"


def run_one(name: str, entry: dict, reports: Path | None = None) -> Result:
    from opscan.scan import scan
    from opscan.verdict import Verdict

    result = Result(name, entry)
    start = time.perf_counter()
    try:
        report = scan(options_of(entry))
    except Exception as exc:  # noqa: BLE001 - a model that can't be scanned is a row of the table
        result.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
        result.seconds = time.perf_counter() - start
        return result
    result.seconds = time.perf_counter() - start
    if reports is not None:
        (reports / f"{name}.json").write_text(canonical_report(report), encoding="utf-8")
    result.rows = len(report.rows)
    result.unknown = sum(1 for r in report.rows if r.verdict == Verdict.UNKNOWN)
    result.non_native = sorted({f"{r.op.display} {r.verdict.value}" for r in report.rows
                                if r.verdict != Verdict.NATIVE})
    result.lane = str(report.lane.name)
    return result


def _inputs_of(entry: dict) -> str:
    return ", ".join(entry.get("inputs", [])) or "factory"


def plain(results: list[Result]) -> str:
    head = f"{'model':28} {'seconds':>7} {'rows':>5} {'unknown':>7} {'non-native':>10}  {'lane':16} status"
    lines = [head]
    for r in results:
        status = "ok" if not r.problems else "; ".join(r.problems)
        if not r.problems and (r.entry.get("known_wrong") or r.entry.get("known_wrong_rows")
                               or r.entry.get("known_missed_rows")):
            status = "known-wrong (see the manifest)"
        if r.fixed:
            status += f"; fixed since noted: {', '.join(r.fixed)}"
        lines.append(f"{r.name:28} {r.seconds:7.1f} {r.rows:5d} {r.unknown:7d} {len(r.non_native):10d}  "
                     f"{r.lane or '-':16} {status}")
    return "\n".join(lines)


def markdown(results: list[Result], reasons: dict[str, str]) -> str:
    lines = ["| model | domain | source | step | seconds | rows | unknown | non-native | lane | expected before run "
             "| non-native rows |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in results:
        e = r.entry
        step = e.get("mode", "train") + (f" {e['dtype']}" if e.get("dtype") else "") + \
            (f" for {e['torch_version']}" if e.get("torch_version") else "")
        noted = e.get("known_wrong") or e.get("known_wrong_rows") or e.get("known_missed_rows")
        lane = r.lane + (" (known-wrong)" if noted else "") if not r.error else "failed"
        rows = ", ".join(f"`{k}`" for k in r.non_native) or "—"
        lines.append(f"| {r.name} | {e.get('domain', '')} | {e.get('source', '')} | {step} | {r.seconds:.1f} | "
                     f"{r.rows} | {r.unknown} | {len(r.non_native)} | {lane} | {r.expectation or '—'} | {rows} |")
    used = sorted({k for r in results for k in r.non_native if k not in _noted(r.entry)})
    lines += ["", "Why each non-native row is true (rule and source):", ""]
    lines += [f"- `{k}`: {reasons.get(k, '**UNEXPLAINED**')}" for k in used]
    return "\n".join(lines + _known_wrong(results) + _corrected(results))


def _noted(entry: dict) -> set[str]:
    """Rows the entry notes as known-wrong predictions (not true rows, so not in the reasons)."""
    return set(entry.get("known_wrong_rows", {})) - set(entry.get("non_native", []))


def _known_wrong(results: list[Result]) -> list[str]:
    wrong = [r for r in results if r.entry.get("known_wrong") or r.entry.get("known_wrong_rows")
             or r.entry.get("known_missed_rows")]
    if not wrong:
        return []
    lines = ["", "Known-wrong predictions (opscan differs from what MPS does, for the reason given; each names the "
             "fix it waits for):", ""]
    for r in wrong:
        e = r.entry
        if e.get("known_wrong"):
            lines.append(f"- {r.name}: lane: {e['known_wrong']}")
        lines += [f"- {r.name}: predicted `{k}`, not true: {why}" for k, why in e.get("known_wrong_rows", {}).items()]
        lines += [f"- {r.name}: true `{k}`, not predicted: {why}" for k, why in e.get("known_missed_rows", {}).items()]
    return lines


def _corrected(results: list[Result]) -> list[str]:
    fixed = [r for r in results if r.entry.get("expectation_fixed")]
    if not fixed:
        return []
    lines = ["", "Expectations written before the run that the run showed wrong (the settled truth is the manifest's "
             "`lane` and `non_native`):", ""]
    return lines + [f"- {r.name}: {r.entry['expectation_fixed']}" for r in fixed]


_SAVED = ("seconds", "rows", "unknown", "non_native", "lane", "error")


def _saved(result: Result) -> dict:
    return {k: getattr(result, k) for k in _SAVED}


def _journal(path: str) -> dict[str, dict]:
    """name -> saved result fields of a --journal file (the last line of a name wins; a torn line is skipped)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            out[row["name"]] = {k: row[k] for k in _SAVED}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(ROOT / "bench" / "zoo.yaml"))
    parser.add_argument("--only", nargs="*", help="scan only these entries")
    parser.add_argument("--markdown", action="store_true", help="print the docs/zoo-table.md table and its reasons")
    parser.add_argument("--journal", help="append each model's result to this file (JSON lines)")
    parser.add_argument("--reuse", action="store_true", help="take the models the journal holds from it")
    parser.add_argument("--reports", help="write each model's report into this folder as canonical JSON (NAME.json: "
                        "no environment or timings), to compare two commits with diff -r")
    args = parser.parse_args(argv)
    reports = Path(args.reports) if args.reports else None
    if reports is not None:
        reports.mkdir(parents=True, exist_ok=True)
    manifest = yaml.safe_load(Path(args.manifest).read_text(encoding="utf-8"))
    defaults = manifest.get("defaults", {})
    models = {name: {**defaults, **entry} for name, entry in manifest["models"].items()
              if not args.only or name in args.only}
    start = time.perf_counter()
    results = []
    done = _journal(args.journal) if args.journal and args.reuse else {}
    for name, entry in models.items():
        if name in done:
            results.append(Result(name, entry, **done[name]))
            continue
        results.append(run_one(name, entry, reports))
        print(f"zoo: {name}: {results[-1].seconds:.1f} s {results[-1].lane or results[-1].error}", file=sys.stderr)
        if args.journal:
            with open(args.journal, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"name": name, **_saved(results[-1])}) + "\n")
    total = time.perf_counter() - start
    print(markdown(results, manifest.get("reasons", {})) if args.markdown else plain(results))
    mismatches = [r for r in results if r.problems]
    rows = sum(r.rows for r in results)
    non_native = sum(len(r.non_native) for r in results)
    noted = sum(len(r.entry.get("known_wrong_rows", {})) + len(r.entry.get("known_missed_rows", {})) for r in results)
    print(f"\n{len(results)} models in {total:.0f} s: {rows} rows, {sum(r.unknown for r in results)} unknown, "
          f"{non_native} non-native, {sum(1 for r in results if r.entry.get('known_wrong'))} known-wrong lanes, "
          f"{noted} known-wrong rows")
    fixed = [r.name for r in results if r.fixed]
    if fixed:
        print(f"zoo_known_wrong_fixed: {len(fixed)} models ({', '.join(fixed)}): drop their notes from the manifest")
    print(f"zoo_mismatches: {len(mismatches)} models")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
