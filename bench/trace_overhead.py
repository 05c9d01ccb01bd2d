"""Benchmark: what opscan's trace costs per call, on real tensors, against eager and two reference modes.

One process, one call-bound training step (torchvision resnet18, batch 2, 3x64x64, cross-entropy, a fresh
AdamW each step; CPU, real tensors), timed five ways in interleaved rounds (each round runs every variant once,
in a rotating order, so load from other jobs spreads over all of them), first at torch's default intra-op
thread count (what users run: the kernels shrink, the modes' Python does not), then at one thread (the
per-call cost alone, without OpenMP's scheduling on a shared machine):

- `eager`: the step alone;
- `bare mode`: inside a pass-through TorchDispatchMode (the least any dispatch mode costs);
- `FlopCounterMode`: PyTorch's own per-call mode (torch.utils.flop_counter, display off);
- `opscan trace`: `opscan.scan.run_trace(..., memory=True)`, the scan's trace as users run it: recorder, MPS
  lens, module and autograd attribution, explicit-move labels, fx node tags and the memory tracker below the
  recorder;
- `opscan, no memory`: the same without the memory tracker (`--no-memory`).

Each variant's median wall time and median CPU time (this thread's) are divided by eager's; the cost per call
is (median - eager's median) / the number of aten calls the step dispatches (counted by the bare mode), in
microseconds, from wall time (what a user waits; at the default thread count the kernels' other threads are
not in this thread's CPU time) and from CPU time. The whole trace counts, its fixed costs too (fx's symbolic
trace of the model, the lens's kernels registered and removed, the patched device branches).

    python bench/trace_overhead.py [--rounds 21] [--batch 2] [--size 64] [--threads 0 1]

The lines before the last are `trace_overhead_1_thread: <ratio> x` and `trace_overhead: <ratio> x` (opscan's
trace over eager in median wall time, at one thread and at the default count); the last line is
`trace_per_call_vs_flopcounter: <ratio> x`: opscan's wall time per call over FlopCounterMode's, at the default
thread count (the goal: 2x or less).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

SPEC = f"{Path(__file__).resolve()}:build"


def build(batch: int = 2, size: int = 64):
    """resnet18 with random weights and one batch of images and labels (the target opscan traces)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    return model, (torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,)))


def loss_fn(outputs, inputs):
    """Cross-entropy against the labels."""
    return F.cross_entropy(outputs, inputs[1])


def train_step(model, optimizer, inputs):
    """Forward on the images, loss, backward, AdamW step, zero_grad."""
    loss_fn(model(inputs[0]), inputs).backward()
    optimizer.step()
    optimizer.zero_grad()


class Bare(TorchDispatchMode):
    """A pass-through dispatch mode that counts calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def variants(target, kb):
    """name -> a function running one step (a fresh AdamW each time, as the trace makes one)."""
    from opscan.scan import ScanOptions, run_trace

    model, inputs = target.model, target.inputs
    plain = ScanOptions(SPEC)

    def eager():
        train_step(model, torch.optim.AdamW(model.parameters()), inputs)

    def bare():
        with Bare():
            eager()

    def flops():
        with FlopCounterMode(display=False):
            eager()

    return {
        "eager": eager,
        "bare mode": bare,
        "FlopCounterMode": flops,
        "opscan trace": lambda: run_trace(target, plain, kb, memory=True),
        "opscan, no memory": lambda: run_trace(target, plain, kb),
    }


def timed(runs: dict, rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Interleaved rounds, each variant once per round in a rotating order: (wall seconds, CPU seconds) lists."""
    for run in runs.values():  # warm-up: first-call caches, lazy imports, this thread count's kernels
        run()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, start_cpu = time.perf_counter(), time.thread_time()
            runs[name]()
            cpu[name].append(time.thread_time() - start_cpu)
            times[name].append(time.perf_counter() - start)
    return times, cpu


def table(times: dict, cpu: dict, calls: int) -> dict[str, float]:
    """Print one line per variant; name -> wall microseconds per call over eager."""
    eager, eager_cpu = statistics.median(times["eager"]), statistics.median(cpu["eager"])
    print(f"{'variant':<20} {'median ms':>10} {'min ms':>8} {'x eager':>8} {'CPU ms':>8} {'x eager':>8} "
          f"{'us/call':>8} {'CPU us/call':>12}")
    per_call = {}
    for name in times:
        median, median_cpu = statistics.median(times[name]), statistics.median(cpu[name])
        per_call[name] = (median - eager) / calls * 1e6
        print(f"{name:<20} {median * 1e3:>10.1f} {min(times[name]) * 1e3:>8.1f} {median / eager:>8.2f} "
              f"{median_cpu * 1e3:>8.1f} {median_cpu / eager_cpu:>8.2f} {per_call[name]:>8.1f} "
              f"{(median_cpu - eager_cpu) / calls * 1e6:>12.1f}")
    return per_call


def main(argv: list[str] | None = None) -> int:
    """Interleave the variants at each thread count, print medians, ratios and per-call costs; the headline
    last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1],
                        help="torch intra-op thread counts, in order (0: torch's default)")
    args = parser.parse_args(argv)
    from opscan.knowledge import load_knowledge
    from opscan.target.load import load_target

    default_threads = torch.get_num_threads()
    target = load_target(SPEC, {"batch": args.batch, "size": args.size}, [])
    runs = variants(target, load_knowledge())
    counter = Bare()
    with counter:
        runs["eager"]()
    print(f"resnet18, batch {args.batch}, 3x{args.size}x{args.size}, {counter.calls} aten calls a step; "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}; {args.rounds} interleaved rounds", flush=True)
    overhead: dict[int, float] = {}
    versus: dict[int, float] = {}
    for threads in args.threads:
        torch.set_num_threads(threads or default_threads)
        print(f"\n{torch.get_num_threads()} torch threads ({'default' if not threads else 'set'}), load average "
              f"{os.getloadavg()[0]:.2f} at the start", flush=True)
        times, cpu = timed(runs, args.rounds)
        per_call = table(times, cpu, counter.calls)
        overhead[threads] = statistics.median(times["opscan trace"]) / statistics.median(times["eager"])
        versus[threads] = per_call["opscan trace"] / per_call["FlopCounterMode"]
        print(f"opscan's trace per call over FlopCounterMode's: {versus[threads]:.2f}x "
              f"({per_call['opscan trace']:.0f} vs {per_call['FlopCounterMode']:.0f} us); load average "
              f"{os.getloadavg()[0]:.2f} at the end", flush=True)
    print()
    for threads in args.threads:
        print(f"trace_overhead{'' if not threads else f'_{threads}_thread'}: {overhead[threads]:.2f} x")
    head = 0 if 0 in versus else args.threads[0]
    print(f"trace_per_call_vs_flopcounter: {versus[head]:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
