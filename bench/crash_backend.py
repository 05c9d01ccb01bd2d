"""Benchmark helper: the real CPU probe backend, except that aten::round segfaults (one injected crash).

Handed to the probe workers by bench/probe_throughput.py as a DeviceDouble (the worker protocol's setup line).
"""

from __future__ import annotations

import ctypes

import torch

from opscan.probe.backends import Backend

CRASH_OP = torch.ops.aten.round.default


class CrashOnRound(Backend):
    """cpu, plus a segfault for aten::round."""

    name = "cpu (bench: aten::round segfaults)"

    def call(self, func, args, kwargs):
        """Segfault on the injected op, run everything else."""
        if func is CRASH_OP:
            ctypes.string_at(0)
        return func(*args, **kwargs)


BACKEND = CrashOnRound()
