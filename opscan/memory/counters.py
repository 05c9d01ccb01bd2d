"""Memory stage (live): what each device says about its memory, read between phases of a real step.

One reader per device in `READERS`, each returning named byte counts; `GROWTH_COUNTER` names the one
whose growth across iterations is judged. Every reader also reports `tensor_bytes` (and its peak since
the last reading), the bytes of live storages counted by opscan's StorageTracker, so the devices can
be compared and a CPU run has a tensor count at all.

- mps: `torch.mps.current_allocated_memory()` (live tensors), `driver_allocated_memory()` (everything
  Metal gave the process, the allocator's cached blocks and MPSGraph's buffers included),
  `recommended_max_memory()` (Metal's recommendedMaxWorkingSetSize);
- cuda: `memory_allocated`, `max_memory_allocated` since the last reading (reset after each), `memory_reserved`;
- cpu: the process's resident set (`/proc/self/statm`; elsewhere the maximum RSS from getrusage).
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Callable

import torch

GROWTH_COUNTER = {"mps": "current_allocated_memory", "cuda": "memory_allocated", "cpu": "tensor_bytes"}


def _tensor(tracker) -> dict[str, int]:
    counts = {"tensor_bytes": tracker.live, "tensor_peak_bytes": tracker.peak}
    tracker.reset_peak()
    return counts


def read_mps(tracker) -> dict[str, int]:
    """MPS's three counters (after a synchronize, so the step's work has landed)."""
    torch.mps.synchronize()
    return {"current_allocated_memory": int(torch.mps.current_allocated_memory()),
            "driver_allocated_memory": int(torch.mps.driver_allocated_memory()),
            "recommended_max_memory": int(torch.mps.recommended_max_memory()), **_tensor(tracker)}


def read_cuda(tracker) -> dict[str, int]:
    """CUDA's allocated, peak-since-last-reading and reserved bytes."""
    torch.cuda.synchronize()
    counts = {"memory_allocated": int(torch.cuda.memory_allocated()),
              "max_memory_allocated": int(torch.cuda.max_memory_allocated()),
              "memory_reserved": int(torch.cuda.memory_reserved()), **_tensor(tracker)}
    torch.cuda.reset_peak_memory_stats()
    return counts


def read_cpu(tracker) -> dict[str, int]:
    """The process's RSS and the tracked tensor bytes."""
    return {**rss(), **_tensor(tracker)}


def rss() -> dict[str, int]:
    """{'rss_bytes': now} from /proc, else {'max_rss_bytes': ...} from getrusage (kB on Linux, B on macOS)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return {"rss_bytes": int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")}
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"max_rss_bytes": int(peak if sys.platform == "darwin" else peak * 1024)}


READERS: dict[str, Callable] = {"mps": read_mps, "cuda": read_cuda, "cpu": read_cpu}
