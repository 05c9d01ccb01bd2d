"""Benchmark: what opscan's trace costs per call, on real tensors, against eager and two reference modes.

One process, one call-bound training step (torchvision resnet18, batch 2, 3x64x64, cross-entropy, a fresh
AdamW each step; CPU, real tensors, one intra-op thread: the per-call cost is the subject, not OpenMP's
scheduling on a shared machine), timed five ways in interleaved rounds (each round runs every variant once,
in a rotating order, so load from other jobs spreads over all of them):

- `eager`: the step alone;
- `bare mode`: inside a pass-through TorchDispatchMode (the least any dispatch mode costs);
- `FlopCounterMode`: PyTorch's own per-call mode (torch.utils.flop_counter, display off);
- `opscan trace`: `opscan.scan.run_trace`, the scan's trace as users run it: recorder, MPS lens, module and
  autograd attribution, explicit-move labels, fx node tags and the memory tracker;
- `opscan, no memory`: the same without the memory tracker (`--no-memory`).

Each variant's median wall time and median CPU time (this thread's) are divided by eager's; the per-call
cost is (median CPU - eager's median CPU) / the number of aten calls the step dispatches (counted by the
bare mode), in microseconds.

    python bench/trace_overhead.py [--rounds 21] [--batch 2] [--size 64] [--threads 1]

The last line is `trace_overhead: <ratio> x`, opscan's trace over eager in median wall time.
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
    plain = ScanOptions(SPEC, memory=False)

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
        "opscan trace": lambda: run_trace(target, plain, kb, []),
        "opscan, no memory": lambda: run_trace(target, plain, kb, None),
    }


def main(argv: list[str] | None = None) -> int:
    """Interleave the variants, print medians, ratios and per-call costs; the headline last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)
    from opscan.knowledge import load_knowledge
    from opscan.target.load import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(SPEC, {"batch": args.batch, "size": args.size}, [])
    runs = variants(target, load_knowledge())
    counter = Bare()
    with counter:
        runs["eager"]()
    for run in runs.values():  # warm-up: first-call caches, lazy imports
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    print(f"resnet18, batch {args.batch}, 3x{args.size}x{args.size}, {counter.calls} aten calls a step; "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
          f"load average {os.getloadavg()[0]:.2f} at the start; {args.rounds} interleaved rounds", flush=True)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, start_cpu = time.perf_counter(), time.thread_time()
            runs[name]()
            cpu[name].append(time.thread_time() - start_cpu)
            times[name].append(time.perf_counter() - start)
    eager, eager_cpu = statistics.median(times["eager"]), statistics.median(cpu["eager"])
    print(f"{'variant':<20} {'median ms':>10} {'min ms':>8} {'x eager':>8} {'CPU ms':>8} {'x eager':>8} "
          f"{'us/call':>8}")
    for name in names:
        median, median_cpu = statistics.median(times[name]), statistics.median(cpu[name])
        print(f"{name:<20} {median * 1e3:>10.1f} {min(times[name]) * 1e3:>8.1f} {median / eager:>8.2f} "
              f"{median_cpu * 1e3:>8.1f} {median_cpu / eager_cpu:>8.2f} "
              f"{(median_cpu - eager_cpu) / counter.calls * 1e6:>8.1f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"trace_overhead: {statistics.median(times['opscan trace']) / eager:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
