"""Probe throughput: a warm pool vs one fresh process per probe, on the same probe set, in one run.

The set: every distinct call of resnet18's training step (examples/cnn.py), probed on the CPU in both
passes (PYTORCH_ENABLE_MPS_FALLBACK unset, then "1"), plus one injected crash (aten::round segfaults
through bench/crash_backend.py). Both modes use the same number of parallel workers. The last line
is `probe_speedup: <N>x` (per-process wall time / pooled wall time); the crash must cost only its probe
in both modes (every other probe ran).

    python bench/probe_throughput.py [--workers N] [--max-elements N] [--sample N]

`--sample N` times the per-process mode on N probes only and extrapolates (printed as such).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(REPO))

from opscan.knowledge import load_knowledge  # noqa: E402
from opscan.probe.backends import DeviceDouble  # noqa: E402
from opscan.mps_view import mps_view  # noqa: E402
from opscan.probe.calls import make, plan  # noqa: E402
from opscan.probe.launch import SpawnLauncher  # noqa: E402
from opscan.probe.protocol import TensorSpec  # noqa: E402
from opscan.probe.runner import RunnerOptions, ask, pass_env, run_probes  # noqa: E402
from opscan.scan import ScanOptions, run_trace  # noqa: E402
from opscan.target.load import load_target  # noqa: E402

TARGET = str(REPO / "examples" / "cnn.py") + ":build_model"
CRASHER = DeviceDouble("crash_backend", "BACKEND", (str(BENCH),))  # the workers load bench/crash_backend.py


def probe_set(max_elements: int | None):
    """resnet18's distinct calls and the injected crash."""
    kb = load_knowledge()
    trace = run_trace(load_target(TARGET, {}, []), ScanOptions(TARGET), kb)
    probes = list(plan(trace, mps_view(trace), "cpu", max_elements).probes)
    crash = make("aten::round", [TensorSpec("float32", (4, 4), (4, 1))], {"args": [{"t": 0}], "kwargs": {}})
    return probes[: len(probes) // 2] + [crash] + probes[len(probes) // 2:], crash


def pooled(probes, options: RunnerOptions):
    """Both passes through the warm pool (the production path)."""
    start = time.monotonic()
    result = run_probes(probes, options)
    return time.monotonic() - start, {**{(k, "off"): v for k, v in result.off.items()},
                                      **{(k, "on"): v for k, v in result.on.items()}}


def per_process(probes, options: RunnerOptions):
    """Both passes, each probe in a fresh interpreter of its own (spawned, used once, killed)."""
    jobs = [(p, pass_name) for pass_name in ("off", "on") for p in probes]
    outcomes, lock = {}, threading.Lock()

    def drain():
        while True:
            with lock:
                if not jobs:
                    return
                probe, pass_name = jobs.pop(0)
            launcher = SpawnLauncher(options.device, pass_env(pass_name), options.startup_timeout, subprocess.DEVNULL,
                                     options.double)
            handle, _ = launcher.start()
            outcome = ask(handle, probe, pass_name, options.timeout)
            handle.kill()
            with lock:
                outcomes[(probe.id, pass_name)] = outcome

    start = time.monotonic()
    threads = [threading.Thread(target=drain) for _ in range(options.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start, outcomes


def check(outcomes: dict, crash, label: str) -> None:
    """The crash is a crash; every other probe ran."""
    bad = [k for k, o in outcomes.items() if k[0] != crash.id and o.status != "ran"]
    crashed = [o.status for k, o in outcomes.items() if k[0] == crash.id]
    print(f"{label}: {len(outcomes)} probe passes; crash probe {crashed}; other probes not run: {len(bad)}")
    assert not bad and set(crashed) == {"crash"}, (bad[:5], crashed)


def main() -> None:
    """Run both modes and print the speed-up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--max-elements", type=int, default=1 << 20)
    parser.add_argument("--sample", type=int, default=0, help="per-process mode on this many probes only")
    args = parser.parse_args()
    probes, crash = probe_set(args.max_elements)
    options = RunnerOptions(device="cpu", workers=args.workers, timeout=120, on_pass="always", log_path=os.devnull,
                            double=CRASHER)
    print(f"probe set: {len(probes)} probes (resnet18's distinct calls + 1 injected crash), both passes, "
          f"{args.workers} workers")
    pool_s, pool_out = pooled(probes, options)
    check(pool_out, crash, f"pooled ({pool_s:.1f} s)")
    subset = probes if not args.sample else [crash] + probes[: args.sample - 1]
    proc_s, proc_out = per_process(subset, options)
    check(proc_out, crash, f"one process per probe ({proc_s:.1f} s)")
    if args.sample:
        proc_s = proc_s * len(probes) / len(subset)
        print(f"one process per probe, extrapolated from {len(subset)} to {len(probes)} probes: {proc_s:.1f} s")
    print(f"wall time: pooled {pool_s:.1f} s, one process per probe {proc_s:.1f} s")
    print(f"probe_speedup: {proc_s / pool_s:.1f}x")


if __name__ == "__main__":
    main()
