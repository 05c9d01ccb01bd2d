"""Benchmark: whole-CLI wall time and peak RSS of `opscan --fake` on LLaMA-style training steps.

Each run is one `python -m opscan examples/llama_big.py:build_model --fake --arg size=S --arg
layers=N -o DIR -q` child process, stdout (the rendered table) to /dev/null. It includes everything:
importing torch, transformers and opscan, building the model and inputs in FakeTensorMode, tracing
the step (forward, loss, backward, AdamW), the MPS view, the verdicts and writing the report files.
Wall time is measured around the child; peak RSS is the child's own `ru_maxrss` from `os.wait4`
(not the maximum over all children, as RUSAGE_CHILDREN would give). Batch 1, sequence 2048, AdamW.

Cost must grow linearly in layers: per width the script fits seconds, MB and traced calls against
layers (least squares) and prints the per-layer slope and the worst relative residual.

    python bench/scan_scale.py                     # 7b and 70b widths, 2, 8, 32 and 80 layers
    python bench/scan_scale.py --sizes 7b --layers 2 32
    python bench/scan_scale.py --cli --no-memory   # more opscan flags, after --cli (here: no memory estimate)

The last line is `scan_7b: <s> s, <MB> MB` for 7b at 32 layers (when that run is in the set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = f"{REPO / 'examples' / 'llama_big.py'}:build_model"


@dataclass(frozen=True)
class Run:
    """One CLI run: its config, wall and CPU seconds, peak RSS (MB) and traced calls."""

    size: str
    layers: int
    seconds: float
    cpu: float
    rss_mb: float
    calls: int


def command(size: str, layers: int, out_dir: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The exact CLI command of one run."""
    return [sys.executable, "-m", "opscan", TARGET, "--fake", "--arg", f"size={size}",
            "--arg", f"layers={layers}", "-o", out_dir, "-q", *extra]


def run_once(size: str, layers: int, extra: tuple[str, ...] = ()) -> Run:
    """Run the CLI as a child process; its wall time, CPU time and its own peak RSS."""
    with tempfile.TemporaryDirectory(prefix="opscan-bench-") as out_dir:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        child = subprocess.Popen(command(size, layers, out_dir, extra), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"run {size}/{layers} failed with exit code {child.returncode}")
        report = json.loads((Path(out_dir) / "report.json").read_text())
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return Run(size, layers, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * scale / 1e6,
               int(report["trace"]["calls"]))


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope and intercept, and the worst residual relative to the measured value."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    intercept = my - slope * mx
    worst = max(abs(intercept + slope * x - y) / y for x, y in zip(xs, ys)) if ys else 0.0
    return slope, intercept, worst


def report(runs: list[Run]) -> None:
    """The table, the per-layer slopes, then the scan_7b line."""
    print(f"{'size':<5} {'layers':>6} {'calls':>7} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12}")
    for r in runs:
        print(f"{r.size:<5} {r.layers:>6} {r.calls:>7} {r.seconds:>8.2f} {r.cpu:>8.2f} {r.rss_mb:>12.0f}")
    for size in dict.fromkeys(r.size for r in runs):
        mine = [r for r in runs if r.size == size]
        if len(mine) < 2:
            continue
        xs = [float(r.layers) for r in mine]
        for label, ys, unit in (("calls", [float(r.calls) for r in mine], "calls"),
                                ("time", [r.seconds for r in mine], "s"), ("CPU", [r.cpu for r in mine], "s"),
                                ("RSS", [r.rss_mb for r in mine], "MB")):
            slope, intercept, worst = fit(xs, ys)
            print(f"{size} {label}: {slope:.4g} {unit}/layer + {intercept:.4g} {unit} "
                  f"(worst deviation from the line {worst:.1%})")
    key = next((r for r in runs if r.size == "7b" and r.layers == 32), None)
    if key is not None:
        print(f"scan_7b: {key.seconds:.2f} s, {key.rss_mb:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every config, print the results."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["7b", "70b"], choices=["7b", "70b", "tiny"])
    p.add_argument("--layers", nargs="+", type=int, default=[2, 8, 32, 80])
    p.add_argument("--cli", nargs=argparse.REMAINDER, default=[], help="more opscan flags (e.g. --no-memory)")
    args = p.parse_args(argv)
    extra = tuple(args.cli)
    print("whole CLI per run, imports included (torch, transformers, opscan); child process peak RSS; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    print("command: " + " ".join(command("SIZE", 0, "DIR", extra)).replace("layers=0", "layers=N"))
    runs = []
    for size in args.sizes:
        for layers in args.layers:
            runs.append(run_once(size, layers, extra))
            print(f"  {size} x {layers}: {runs[-1].seconds:.2f} s ({runs[-1].cpu:.2f} s CPU), "
                  f"{runs[-1].rss_mb:.0f} MB", flush=True)
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
