"""Probe throughput: the warm pool against its floor and against one fresh process per probe, in one run.

The set: every distinct call of resnet18's training step (examples/cnn.py), probed on the CPU in both
passes (PYTORCH_ENABLE_MPS_FALLBACK unset, then "1"), plus one injected crash (aten::round segfaults
through bench/crash_backend.py). Every mode uses the same number of parallel workers:

- **floor**: each pass, `workers` fresh processes each run their share of the probes one after another in
  that one process (the worker's own `run_one`), with no isolation at all — what the probes cost by
  themselves, process start and imports included. The crash probe is left out (it would end its worker).
- **pool, fork server**: `run_probes` as a Linux scan runs it (isolation "zygote": workers forked from a
  warm interpreter per pass);
- **pool, spawn**: the same with fresh interpreters as workers (isolation "spawn"), the path a Mac takes
  (Metal is not fork-safe);
- **one process per probe**: each probe pass in a fresh interpreter of its own (spawned, used once,
  killed); `--sample N` times it on N probes and extrapolates (printed as such).

The crash must cost only its probe in the pooled and per-process modes (every other probe ran).

    python bench/probe_throughput.py [--workers N] [--max-elements N] [--sample N] [--rounds 2] [--skip-spawn]

The floor and the pools run in `--rounds` rounds (rotating order; medians reported); each worker gets its
share of the cores for torch's threads (OMP_NUM_THREADS, as the pool sets it), in every mode.

The last line is `probe_speedup: <N> x`: one process per probe over the slower of the two pools; the line
before it gives each pool's time over the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])  # for every child
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(REPO))

TARGET = str(REPO / "examples" / "cnn.py") + ":build_model"
CRASH_BACKEND = ("crash_backend", "BACKEND", (str(BENCH),))  # the workers load bench/crash_backend.py


def crasher():
    """The test double every mode's workers run on: the CPU, and aten::round segfaults."""
    from opscan.probe.backends import DeviceDouble

    return DeviceDouble(*CRASH_BACKEND)


def probe_set(max_elements: int | None):
    """resnet18's distinct calls and the injected crash."""
    from opscan.knowledge import load_knowledge
    from opscan.mps_view import mps_view
    from opscan.probe.calls import make, plan
    from opscan.probe.protocol import TensorSpec
    from opscan.scan import ScanOptions, run_trace
    from opscan.target.load import load_target

    kb = load_knowledge()
    trace = run_trace(load_target(TARGET, {}, []), ScanOptions(TARGET), kb)
    probes = list(plan(trace, mps_view(trace), "cpu", max_elements).probes)
    crash = make("aten::round", [TensorSpec("float32", (4, 4), (4, 1))], {"args": [{"t": 0}], "kwargs": {}})
    return probes[: len(probes) // 2] + [crash] + probes[len(probes) // 2:], crash


def floor(probes, workers: int) -> float:
    """Both passes, each pass `workers` processes running their share with no isolation; wall seconds."""
    from opscan.probe.runner import pass_env

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="opscan-floor-") as folder:
        for pass_name in ("off", "on"):
            children = []
            for w in range(workers):
                share = Path(folder) / f"{pass_name}-{w}.json"
                share.write_text(json.dumps([p.to_dict() for p in probes[w::workers]]))
                children.append(subprocess.Popen([sys.executable, __file__, "--floor-child", pass_name, str(share)],
                                                 env=pass_env(pass_name, workers=workers), stdout=subprocess.PIPE))
            ran = sum(int(child.communicate()[0] or 0) for child in children)
            if ran != len(probes) or any(child.returncode for child in children):
                raise SystemExit(f"floor pass {pass_name}: {ran} of {len(probes)} probes ran")
    return time.monotonic() - start


def floor_child(pass_name: str, share: str) -> None:
    """One floor worker: its share of the probes in this process, as a pooled worker runs each one."""
    import torch

    from opscan.probe.protocol import ProbeCall
    from opscan.probe.worker import preload, run_one

    backend = preload("cpu", crasher().to_dict())
    backend.prepare()
    torch.set_warn_always(True)
    calls = [ProbeCall.from_dict(d) for d in json.loads(Path(share).read_text())]
    print(sum(1 for call in calls if run_one(call, pass_name, backend).status != "crash"))


def pooled(probes, options):
    """Both passes through the warm pool (the production path)."""
    from opscan.probe.runner import run_probes

    start = time.monotonic()
    result = run_probes(probes, options)
    return time.monotonic() - start, {**{(k, "off"): v for k, v in result.off.items()},
                                      **{(k, "on"): v for k, v in result.on.items()}}


def per_process(probes, options):
    """Both passes, each probe in a fresh interpreter of its own (spawned, used once, killed)."""
    from opscan.probe.launch import SpawnLauncher
    from opscan.probe.runner import ask, pass_env

    jobs = [(p, pass_name) for pass_name in ("off", "on") for p in probes]
    outcomes, lock = {}, threading.Lock()

    def drain():
        while True:
            with lock:
                if not jobs:
                    return
                probe, pass_name = jobs.pop(0)
            env = pass_env(pass_name, workers=options.workers)
            launcher = SpawnLauncher(options.device, env, options.startup_timeout, subprocess.DEVNULL, options.double)
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
    """The crash is a crash; every other probe ran; how many were re-run alone after a pooled run."""
    bad = [k for k, o in outcomes.items() if k[0] != crash.id and o.status != "ran"]
    crashed = [o.status for k, o in outcomes.items() if k[0] == crash.id]
    rerun = sum(1 for o in outcomes.values() if o.confirmed)
    print(f"{label}: {len(outcomes)} probe passes; crash probe {crashed}; other probes not run: {len(bad)}; "
          f"re-run alone after a pooled run: {rerun}", flush=True)
    assert not bad and set(crashed) == {"crash"}, (bad[:5], crashed)


def main(argv: list[str] | None = None) -> int:
    """Run every mode and print the table and the headline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--max-elements", type=int, default=1 << 20)
    parser.add_argument("--sample", type=int, default=0, help="per-process mode on this many probes only")
    parser.add_argument("--skip-spawn", action="store_true", help="leave out the spawned pool")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of floor and pools (medians are reported)")
    parser.add_argument("--floor-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_child:
        floor_child(*args.floor_child)
        return 0
    from opscan.probe.runner import RunnerOptions

    probes, crash = probe_set(args.max_elements)
    options = RunnerOptions(device="cpu", workers=args.workers, timeout=120, on_pass="always", log_path=os.devnull,
                            double=crasher())
    print(f"probe set: {len(probes)} probes (resnet18's distinct calls + 1 injected crash), both passes, "
          f"{args.workers} workers; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    kinds = ["floor", "zygote"] + ([] if args.skip_spawn else ["spawn"])
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):  # rotating order: load from other jobs falls on every mode
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            if kind == "floor":
                seconds = floor([p for p in probes if p.id != crash.id], args.workers)
                print(f"floor ({seconds:.1f} s): {2 * (len(probes) - 1)} probe passes, no isolation, no crash probe",
                      flush=True)
            else:
                seconds, outcomes = pooled(probes, RunnerOptions(**{**options.__dict__, "isolation": kind}))
                check(outcomes, crash, f"pool, {kind} ({seconds:.1f} s)")
            times[kind].append(seconds)
    floor_s = statistics.median(times.pop("floor"))
    pools = {kind: statistics.median(values) for kind, values in times.items()}
    subset = probes if not args.sample else [crash] + [p for p in probes if p.id != crash.id][: args.sample - 1]
    proc_s, proc_out = per_process(subset, options)
    check(proc_out, crash, f"one process per probe ({proc_s:.1f} s)")
    if args.sample:
        proc_s = proc_s * len(probes) / len(subset)
        print(f"one process per probe, extrapolated from {len(subset)} to {len(probes)} probes: {proc_s:.1f} s")
    print(f"\n{'mode':<28} {'wall s':>8} {'x floor':>8} {'speed-up':>9}")
    print(f"{'floor (no isolation)':<28} {floor_s:>8.1f} {1:>8.2f} {proc_s / floor_s:>8.1f}x")
    for kind, seconds in pools.items():
        label = "pool, fork server" if kind == "zygote" else "pool, spawn (as on a Mac)"
        print(f"{label:<28} {seconds:>8.1f} {seconds / floor_s:>8.2f} {proc_s / seconds:>8.1f}x")
    print(f"{'one process per probe':<28} {proc_s:>8.1f} {proc_s / floor_s:>8.2f} {1:>8.1f}x")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print("pool_vs_floor: " + ", ".join(f"{kind} {s / floor_s:.2f}x" for kind, s in pools.items()))
    print(f"probe_speedup: {proc_s / max(pools.values()):.1f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
