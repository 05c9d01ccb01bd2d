"""Benchmark: one trace per model for every release (opscan.zoo.releases.scan_releases), against one whole scan
per release, on the zoo's models (bench/zoo.yaml; an entry's own torch_version is ignored: every release is judged).

Per model it prints the seconds `scan_releases` took for all the knowledge base's releases, how many traces it
made, and how many distinct lanes the releases got; with `--check` also the seconds of the old way (a
`--torch-version R` scan per release, memory off, `result_of(scan(...))`) and whether every release's
ReleaseResult equals it (lane, its reasons, the blocking rows with their evidence). The last lines are the
headline:

    python bench/zoo_releases.py [--only NAME ...] [--releases R ...] [--check]
    ...
    zoo_releases: 53 models, 61 traces, 212.3 s (old: 2480.0 s), 0 differ

Exit status 1 when a release differs or a model fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from zoo import options_of  # noqa: E402 - bench/zoo.py: a manifest entry as ScanOptions


def per_release(options, releases=None) -> dict:
    """The yardstick: one whole scan per release (`releases`, default every release of the knowledge base)."""
    from opscan.knowledge import kb_releases
    from opscan.scan import scan
    from opscan.zoo.releases import result_of

    return {r: result_of(scan(replace(options, torch_version=r, memory=False)), r) for r in releases or kb_releases()}


def run_one(name: str, entry: dict, check: bool, releases=None) -> dict:
    """One model: new seconds, traces, lanes; with `check` the old seconds and the releases that differ."""
    from opscan.zoo.releases import scan_releases

    options = replace(options_of(entry), torch_version=None)
    start = time.perf_counter()
    new = scan_releases(options, tuple(releases) if releases else None)
    found = {"name": name, "seconds": time.perf_counter() - start, "traces": next(iter(new.values())).traces,
             "lanes": len({r.lane for r in new.values()}), "first_native": next(
                 (r.release for r in new.values() if r.native), "-"), "old": None, "differ": []}
    if check:
        start = time.perf_counter()
        old = per_release(options, releases)
        found.update(old=time.perf_counter() - start, differ=[r for r in old if old[r] != new[r]])
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(BENCH / "zoo.yaml"))
    parser.add_argument("--only", nargs="*", help="only these entries")
    parser.add_argument("--check", action="store_true", help="also scan once per release and compare")
    parser.add_argument("--releases", nargs="*", help="only these releases (default: every release)")
    args = parser.parse_args(argv)
    manifest = yaml.safe_load(Path(args.manifest).read_text(encoding="utf-8"))
    models = {name: {**manifest.get("defaults", {}), **entry} for name, entry in manifest["models"].items()
              if not args.only or name in args.only}
    print(f"{'model':28} {'seconds':>7} {'traces':>6} {'lanes':>5} {'native from':>11} {'old s':>7}  differ")
    results, failed = [], []
    for name, entry in models.items():
        try:
            r = run_one(name, entry, args.check, args.releases)
        except Exception as exc:  # noqa: BLE001 - a model that fails is a line, not the end of the run
            failed.append(name)
            print(f"{name:28} failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}", flush=True)
            continue
        results.append(r)
        old = f"{r['old']:7.1f}" if r["old"] is not None else "      -"
        print(f"{name:28} {r['seconds']:7.1f} {r['traces']:6d} {r['lanes']:5d} {r['first_native']:>11} {old}  "
              f"{','.join(r['differ']) or '-'}", flush=True)
    old = sum(r["old"] for r in results) if args.check else None
    differ = sum(1 for r in results if r["differ"])
    print(f"zoo_releases: {len(results)} models, {sum(r['traces'] for r in results)} traces, "
          f"{sum(r['seconds'] for r in results):.1f} s" + (f" (old: {old:.1f} s)" if old is not None else "")
          + f", {differ} differ" + (f", {len(failed)} failed: {' '.join(failed)}" if failed else ""))
    return 1 if differ or failed else 0


if __name__ == "__main__":
    sys.exit(main())
