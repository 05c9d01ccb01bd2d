"""Memory stage: compose the estimate, the sizing runs, the Mac table and the bfloat16 check.

`tracking(sink)` is handed to the trace (trace_step's `memory`): it registers the model's parameters,
buffers and inputs in a `StorageTracker`, which the recorder hands every call it passes on, so the trace
and the estimate see the same calls and the peak can be named by the recorder's call (phase, module, op).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from opscan.memory.batch import Stand, batch_of, scaled_runs
from opscan.memory.bf16 import blockers
from opscan.memory.estimate import estimate, without_indices
from opscan.memory.section import memory_section
from opscan.memory.sizing import fit_curve, size_macs
from opscan.memory.tracker import track_step
from opscan.opkey import macos_text

POOL_RULE = "mps-max-pool2d"  # lens.py: MPS runs its own max_pool2d, which keeps no indices


def tracking(sink: list):
    """trace_step's `memory` factory: the tracker it makes is appended to `sink`."""
    def make(model, inputs, clock):
        tracker = track_step(model, inputs, clock)
        sink.append(tracker)
        return tracker
    return make


def estimate_memory(target, trace, view, kb, tracker, dtype: str | None, inference: bool,
                    repeat: bool = True) -> dict[str, Any]:
    """The report's `memory` section for a traced step (`repeat`: sizing runs take the repeated-layers shortcut)."""
    from opscan.predict.calls import amp_of, has_mps_kernel

    pools = frozenset(i for g in trace.groups if g.rule == POOL_RULE and g.mode == "replace"
                      for i in range(g.start, g.end))
    est = estimate(without_indices(tracker.timeline(batch_of(target.inputs)), pools), where_of(trace.calls))
    stand = Stand(est.optimizer_excess, *est.state)
    scaling = scaled_runs(target, dtype, inference, has_mps_kernel(kb), kb.macos, stand, amp_of(kb), repeat)
    curve = bf16_curve = None
    if est.batch and scaling.runs:
        curve = fit_curve(tuple((r.batch, r.curve) for r in scaling.runs), est.batch, est.peak.bytes)
        bf16_curve = fit_curve(tuple((r.batch, r.bf16_curve) for r in scaling.runs), est.batch, est.bf16_peak)
    fits = size_macs(est.peak.bytes, est.bf16_peak, curve, bf16_curve, kb.macos[0])
    blocked = () if dtype else blockers(view, kb)
    return memory_section(est, fits, _placed(scaling, trace).to_dict(), macos_text(kb.macos), blocked, dtype)


def _placed(scaling, trace):
    """The scaling, its note naming the step's host tensors that meet its device tensors (the placement model) when
    the sizing runs failed and there are such: what stops them is then most likely the user's placement bug."""
    met = trace.met_device()
    if scaling.runs or not met:
        return scaling
    names = ", ".join(f"{h.name or 'a tensor made before the step'}"
                      f"{f' {os.path.basename(h.where.file)}:{h.where.line}' if h.where and h.where.file else ''}"
                      for h in met[:4]) + (", …" if len(met) > 4 else "")
    many = len(met) > 1
    note = (f"{scaling.note} — the step keeps {len(met)} tensor{'s' if many else ''} on the CPU that "
            f"meet{'' if many else 's'} its device tensors, as on a Mac ({names}: the placement findings); fix "
            f"{'them' if many else 'it'} and the sizing runs")
    return dataclasses.replace(scaling, note=note)


def where_of(calls):
    """call index -> (phase, module, op) of the trace."""
    def where(clock: int) -> tuple[str, str, str]:
        if 0 <= clock < len(calls) and calls[clock] is not None:
            call = calls[clock]
            return call.phase, call.module, call.op.display
        return "unknown", "", ""
    return where
