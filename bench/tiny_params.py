"""Benchmark: a model of many tiny parameters — is the scan's cost linear in calls, and how big is the GraphML?

**Target** (`build` below): N scalar parameters, each added to the input once in forward (`x = x + p`), so the
step has 16 calls per parameter: forward 1 (`add`), backward 2 (the broadcast gradient summed back to the scalar,
and its accumulation), the for-loop AdamW 13 (step counter, moments, bias corrections, update) — 320k calls at
20,000 parameters, almost all of them in the optimizer's per-parameter loop.

**Run**: the default `python -m opscan bench/tiny_params.py:build --arg n=N -o DIR -q` child, as users run it
(trace, MPS view, verdicts, step graph, memory estimate, report files). Wall time is measured around the child,
CPU time and peak RSS are its own (`os.wait4`); each run is cold (a new output folder); with `--repeat R` each
size runs R times and its least CPU time counts (other jobs only ever add time). Per call = the child's CPU
seconds over the trace's calls (`report.json` trace.calls); the marginal cost of a size is its CPU minus the
smallest size's, over its calls minus the smallest size's: the fixed cost (imports, the model's build, the report
files' frame) drops out, and every size is measured from the same base.

    python bench/tiny_params.py                              # 100 (the base) / 2,000 / 5,000 / 20,000 parameters
    python bench/tiny_params.py --sizes 100 1000 4000 --repeat 2

The line before the last is `tiny_params_graphml: <MB> MB` (the call-level GraphML file of the largest size,
as written: graph.graphml, or graph.graphml.gz above 100,000 nodes and edges); the last line is
`tiny_params_linearity: <ratio> x`, the marginal CPU per call of the largest size over that of the second
smallest (1.0: linear; the issue's 223 s at 20,000 parameters was quadratic in parameters).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = f"{Path(__file__).resolve()}:build"


def build(n: int = 2000):
    """(model, inputs): n scalar parameters, each added to a 4 x 8 input in turn."""
    import torch

    class Scalars(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scalars = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(())) for _ in range(n)])

        def forward(self, x):
            for p in self.scalars:
                x = x + p
            return x

    return Scalars(), torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class Run:
    """One scan: parameters, traced calls, wall and CPU seconds, peak RSS, the GraphML written and its text size."""

    params: int
    calls: int
    seconds: float
    cpu: float
    rss_mb: float
    graphml: str
    file_mb: float
    text_mb: float


def command(n: int, out_dir: str) -> list[str]:
    """The exact CLI command of one scan."""
    return [sys.executable, "-m", "opscan", SPEC, "--arg", f"n={n}", "-o", out_dir, "-q"]


def scan(n: int) -> Run:
    """One cold scan in a child process."""
    with tempfile.TemporaryDirectory(prefix="opscan-tiny-") as out_dir:
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        start = time.perf_counter()
        child = subprocess.Popen(command(n, out_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                 cwd=REPO)
        stderr = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"scan of {n} parameters failed with exit code {code}:\n{stderr.decode()[-2000:]}")
        report = json.loads((Path(out_dir) / "report.json").read_text())
        name = report["graph"]["files"]["calls"]
        data = (Path(out_dir) / name).read_bytes()
        text = len(gzip.decompress(data)) if name.endswith(".gz") else len(data)
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return Run(n, int(report["trace"]["calls"]), seconds, usage.ru_utime + usage.ru_stime,
               usage.ru_maxrss * scale / 1e6, name, len(data) / 1e6, text / 1e6)


def marginal(a: Run, b: Run) -> float:
    """CPU microseconds per call added between two sizes."""
    return (b.cpu - a.cpu) / (b.calls - a.calls) * 1e6


def least(n: int, repeat: int) -> Run:
    """The run of `repeat` cold scans of `n` parameters with the least CPU time."""
    return min((scan(n) for _ in range(repeat)), key=lambda r: r.cpu)


def main(argv: list[str] | None = None) -> int:
    """Scan each size, print the table, the GraphML size and the linearity last."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[100, 2000, 5000, 20000],
                   help="parameter counts, the smallest the base")
    p.add_argument("--repeat", type=int, default=1, help="cold scans per size, the least CPU time counts")
    args = p.parse_args(argv)
    sizes = sorted(set(args.sizes))
    if len(sizes) < 3:
        p.error("give three sizes or more (a base and two sizes to compare)")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    print("scan: " + " ".join(command(0, "DIR")).replace("n=0", "n=N"))
    print(f"{'params':>7} {'calls':>7} {'wall s':>7} {'CPU s':>7} {'µs/call':>8} {'marginal µs/call':>17} "
          f"{'RSS MB':>7} {'GraphML written':>22} {'text MB':>8}", flush=True)
    runs: list[Run] = []
    for n in sizes:
        r = least(n, args.repeat)
        step = f"{marginal(runs[0], r):17.0f}" if runs else f"{'(base)':>17}"
        runs.append(r)
        print(f"{r.params:>7} {r.calls:>7} {r.seconds:7.1f} {r.cpu:7.1f} {r.cpu / r.calls * 1e6:8.0f} {step} "
              f"{r.rss_mb:7.0f} {r.graphml + f' {r.file_mb:.1f} MB':>22} {r.text_mb:8.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    first, last = marginal(runs[0], runs[1]), marginal(runs[0], runs[-1])
    print(f"marginal CPU per call over the base ({runs[0].params} parameters): {first:.0f} µs at {runs[1].params} "
          f"parameters, {last:.0f} µs at {runs[-1].params}")
    print(f"tiny_params_graphml: {runs[-1].file_mb:.1f} MB")
    print(f"tiny_params_linearity: {last / first:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
