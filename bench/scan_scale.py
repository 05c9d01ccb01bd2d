"""Benchmark: the default `opscan --fake` scan of a LLaMA step against its floor, side by side.

**Floor**: a child process that imports torch and transformers, builds the same model (examples/llama_big.py)
under a plain FakeTensorMode and runs one fake training step — forward, loss, backward, AdamW — recording
nothing. **Scan**: the default `python -m opscan examples/llama_big.py:build_model --fake --arg size=S --arg
layers=N -o DIR -q` child (memory estimate included, as users run it; table to /dev/null). Both are whole
processes, imports included; wall time is measured around the child, CPU time and peak RSS are the child's own
(`os.wait4`). Batch 1, sequence 2048.

The two alternate (floor, scan, scan, floor, ...: each round swaps the order) so that load from other jobs
hits both sides; every run is cold (a new output folder; opscan keeps no cache on disk). The ratio is the
median scan over the median floor; the load average is printed at the start and the end.

With more than one layer count per width the script fits scan seconds, CPU seconds, MB and traced calls
against layers (least squares: the per-layer slope and the worst deviation from the line).

    python bench/scan_scale.py                             # 7b x 32 and 70b x 80 layers, 3 rounds
    python bench/scan_scale.py --sizes 7b --layers 8 32 --rounds 2
    python bench/scan_scale.py --cli --no-memory           # more opscan flags, after --cli
    python bench/scan_scale.py --sizes 405b --rounds 1     # Llama 3.1 405B's shape, 126 layers
    python bench/scan_scale.py --cli --no-repeat           # every layer traced (no repeated-layers shortcut)

The last line is `scan_vs_floor: <ratio> x`, the worst ratio over the widths measured at their full depth
(7b x 32, 70b x 80), or over every config when neither was run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "llama_big.py"
TARGET = f"{EXAMPLE}:build_model"
FULL = {"7b": 32, "70b": 80, "405b": 126, "tiny": 2}


@dataclass(frozen=True)
class Run:
    """One child process: its kind (floor | scan), config, wall and CPU seconds, peak RSS (MB), traced calls."""

    kind: str
    size: str
    layers: int
    seconds: float
    cpu: float
    rss_mb: float
    calls: int | None


def scan_command(size: str, layers: int, out_dir: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The exact CLI command of one scan."""
    return [sys.executable, "-m", "opscan", TARGET, "--fake", "--arg", f"size={size}",
            "--arg", f"layers={layers}", "-o", out_dir, "-q", *extra]


def floor_command(size: str, layers: int) -> list[str]:
    """This script in floor mode: the bare fake step of the same model."""
    return [sys.executable, str(Path(__file__).resolve()), "--floor-child", size, str(layers)]


def floor_child(size: str, layers: int) -> None:
    """The floor: import torch and transformers, build the model in FakeTensorMode, one fake training step."""
    import torch
    import transformers  # noqa: F401  (the scan imports it through the example too)
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, str(EXAMPLE.parent))
    import llama_big

    with FakeTensorMode(allow_non_fake_inputs=True):
        model, inputs = llama_big.build_model(size=size, layers=layers)
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def run_child(kind: str, size: str, layers: int, extra: tuple[str, ...] = ()) -> Run:
    """Run one child process; its wall time, CPU time and its own peak RSS."""
    with tempfile.TemporaryDirectory(prefix="opscan-bench-") as out_dir:
        cmd = scan_command(size, layers, out_dir, extra) if kind == "scan" else floor_command(size, layers)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
            [str(REPO), os.environ.get("PYTHONPATH", "")])}
        start = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
        stderr = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"{kind} {size}/{layers} failed with exit code {code}:\n{stderr.decode()[-2000:]}")
        calls = None
        if kind == "scan":
            calls = int(json.loads((Path(out_dir) / "report.json").read_text())["trace"]["calls"])
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return Run(kind, size, layers, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * scale / 1e6, calls)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope and intercept, and the worst residual relative to the measured value."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    intercept = my - slope * mx
    worst = max(abs(intercept + slope * x - y) / y for x, y in zip(xs, ys)) if ys else 0.0
    return slope, intercept, worst


def med(runs: list[Run], field: str) -> float:
    """The median of one field over runs."""
    return statistics.median(getattr(r, field) for r in runs)


def summarize(runs: list[Run]) -> dict[tuple[str, int], float]:
    """The per-config table (medians) and the slopes; returns the scan/floor ratio per config."""
    print(f"\n{'size':<5} {'layers':>6} {'calls':>6} {'floor s':>8} {'scan s':>8} {'ratio':>6} "
          f"{'floor CPU':>9} {'scan CPU':>9} {'CPU ratio':>9} {'floor MB':>9} {'scan MB':>8}")
    ratios = {}
    configs = list(dict.fromkeys((r.size, r.layers) for r in runs))
    for size, layers in configs:
        floor = [r for r in runs if (r.size, r.layers, r.kind) == (size, layers, "floor")]
        scan = [r for r in runs if (r.size, r.layers, r.kind) == (size, layers, "scan")]
        ratios[(size, layers)] = ratio = med(scan, "seconds") / med(floor, "seconds")
        print(f"{size:<5} {layers:>6} {scan[0].calls:>6} {med(floor, 'seconds'):>8.2f} {med(scan, 'seconds'):>8.2f} "
              f"{ratio:>6.2f} {med(floor, 'cpu'):>9.2f} {med(scan, 'cpu'):>9.2f} "
              f"{med(scan, 'cpu') / med(floor, 'cpu'):>9.2f} {med(floor, 'rss_mb'):>9.0f} {med(scan, 'rss_mb'):>8.0f}")
    for size in dict.fromkeys(s for s, _ in configs):
        layers = sorted({n for s, n in configs if s == size})
        if len(layers) < 2:
            continue
        for label, field, unit in (("calls", "calls", "calls"), ("scan time", "seconds", "s"),
                                   ("scan CPU", "cpu", "s"), ("scan RSS", "rss_mb", "MB")):
            ys = [med([r for r in runs if (r.size, r.layers, r.kind) == (size, n, "scan")], field) for n in layers]
            slope, intercept, worst = fit([float(n) for n in layers], [float(y) for y in ys])
            print(f"{size} {label}: {slope:.4g} {unit}/layer + {intercept:.4g} {unit} "
                  f"(worst deviation from the line {worst:.1%})")
    return ratios


def main(argv: list[str] | None = None) -> int:
    """Parse options, alternate floor and scan children, print the table and the headline."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["7b", "70b"], choices=list(FULL))
    p.add_argument("--layers", nargs="+", type=int, help="layer counts (default: each width's full depth)")
    p.add_argument("--rounds", type=int, default=3, help="floor/scan pairs per config (default 3)")
    p.add_argument("--floor-child", nargs=2, metavar=("SIZE", "LAYERS"), help=argparse.SUPPRESS)
    p.add_argument("--cli", nargs=argparse.REMAINDER, default=[], help="more opscan flags (e.g. --no-memory)")
    args = p.parse_args(argv)
    if args.floor_child:
        floor_child(args.floor_child[0], int(args.floor_child[1]))
        return 0
    extra = tuple(args.cli)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; {args.rounds} rounds, "
          "floor and scan alternated, each a cold child process")
    print("scan:  " + " ".join(scan_command("SIZE", 0, "DIR", extra)).replace("layers=0", "layers=N"))
    print("floor: " + " ".join(floor_command("SIZE", 0)).replace(" 0", " N"))
    runs: list[Run] = []
    for size in args.sizes:
        for layers in args.layers or [FULL[size]]:
            for round_ in range(args.rounds):
                for kind in (("floor", "scan") if round_ % 2 == 0 else ("scan", "floor")):
                    runs.append(run_child(kind, size, layers, extra))
                    r = runs[-1]
                    print(f"  {kind:<5} {size} x {layers}: {r.seconds:6.2f} s wall, {r.cpu:6.2f} s CPU, "
                          f"{r.rss_mb:5.0f} MB  (load {os.getloadavg()[0]:.2f})", flush=True)
    ratios = summarize(runs)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    full = {key: v for key, v in ratios.items() if FULL[key[0]] == key[1]} or ratios
    print("ratios: " + ", ".join(f"{s} x {n} {v:.2f}x" for (s, n), v in full.items()))
    print(f"scan_vs_floor: {max(full.values()):.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
