"""Benchmark: `opscan zoo` throughput on a fixed sample of timm models, through the local pool and through Ray.

The sample is deterministic: timm.list_models() sorted, then every k-th name from the first (k = the list's
length // --count), so the same timm gives the same ~100 models (architectures spread over the alphabet, not
one family). Each model is scanned at full size with fake tensors (opscan.zoo.factories:timm_model), the way
`opscan zoo timm` does. The sample is written as a manifest and run twice by the shipped command, in a child
process each (`python -m opscan zoo MANIFEST -o DIR --workers N` and `... --ray auto`, which starts a local Ray
instance on every core: use --workers equal to the core count for a like-for-like figure), each into a fresh
folder (no journal to resume):

    python bench/zoo_throughput.py [--count 100] [--workers N] [--releases 2.14.1] [--skip-ray] [--keep DIR]
    ...
    pool: 100 models (3 error rows) in 412 s: 14.6 models/min
    ray:  100 models (3 error rows) in 398 s: 15.1 models/min
    zoo_models_per_minute: 14.6 models/min (pool), 15.1 models/min (ray)

The headline's first figure is the pool's. `--releases` defaults to one release because the zoo's cost grows
with the releases it judges until one trace serves them all (issue 19, part A); say which you used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sample(count: int) -> list[str]:
    """Every k-th name of timm's sorted model list (k = len // count), from the first."""
    import timm

    names = sorted(timm.list_models())
    step = max(1, len(names) // count)
    return names[::step][:count]


def write_manifest(path: Path, names: list[str]) -> None:
    lines = ["# bench/zoo_throughput.py's sample of timm (every k-th name of the sorted list)", "models:"]
    for name in names:
        lines += [f"  {json.dumps(name)}:", "    target: opscan.zoo.factories:timm_model",
                  f"    args: {{name: {json.dumps(name)}}}", "    source: timm"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(manifest: Path, out: Path, workers: int, releases: str, ray: bool) -> tuple[float, dict]:
    """Seconds the shipped command took, and the leaderboard's counts."""
    command = [sys.executable, "-m", "opscan", "zoo", str(manifest), "-o", str(out), "--workers", str(workers),
               "--releases", releases, "-q"] + (["--ray", "auto"] if ray else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"zoo_throughput: {' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads((out / "leaderboard.json").read_text())["counts"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--releases", default="2.14.1")
    parser.add_argument("--skip-ray", action="store_true", help="the pool only (where Ray is not installed)")
    parser.add_argument("--keep", metavar="DIR", help="copy the pool run's leaderboard.{html,json,csv} here")
    args = parser.parse_args(argv)
    names = sample(args.count)
    print(f"zoo_throughput: {len(names)} timm models ({names[0]} … {names[-1]}), releases {args.releases}, "
          f"{args.workers} workers", file=sys.stderr)
    rates = {}
    with tempfile.TemporaryDirectory(prefix="zoo-throughput-") as tmp:
        manifest = Path(tmp) / "timm_sample.yaml"
        write_manifest(manifest, names)
        for engine in ("pool",) + (() if args.skip_ray else ("ray",)):
            seconds, counts = run(manifest, Path(tmp) / engine, args.workers, args.releases, engine == "ray")
            rates[engine] = counts["models"] / seconds * 60
            print(f"{engine + ':':5} {counts['models']} models ({counts['errors']} error rows) in {seconds:.0f} s: "
                  f"{rates[engine]:.1f} models/min", flush=True)
            if args.keep and engine == "pool":
                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                for name in ("leaderboard.html", "leaderboard.json", "leaderboard.csv"):
                    shutil.copyfile(Path(tmp) / engine / name, keep / name)
    figures = ", ".join(f"{rate:.1f} models/min ({engine})" for engine, rate in rates.items())
    print(f"zoo_models_per_minute: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
