"""Memory stage: the report's `memory` section, its one console line and its lane effect (pure).

The section is plain data (report.json `memory`, schema in opscan/schema/report-v4.json); the console
and the HTML page read it, never recompute it.
"""

from __future__ import annotations

from typing import Any

from opscan.memory.estimate import Estimate
from opscan.memory.sizing import FIT_MARGIN, HARD_CAP_RATIO, MAX_BATCH, Fit
from opscan.units import human_bytes

BASIS = ("tensor bytes: every storage the step holds, from its allocation until the storage object is freed, "
         "in the step as MPS dispatches it (attention with grad on its math path, with the B x H x L x L scores); "
         "the steady-state step (optimizer state already allocated)")
NOT_COUNTED = (
    "the MPS allocator's caching and size rounding (driver_allocated_memory() minus current_allocated_memory())",
    "MPSGraph internals: buffers a graph allocates inside one kernel",
    "fragmentation of the allocator's pools",
    "what macOS, Python, the framework and other apps hold (part of the same unified memory)",
    "an LSTM is counted as the CPU's cells, not as _lstm_mps's own workspace",
)


def fit_line(peak: int, fits: tuple[Fit, ...]) -> str:
    """'peak 7.9 GB: fits 16 GB Macs, tight on 8 GB' (the smallest Mac it fits and the smaller tight ones)."""
    fitting, tight, smaller = _by_fit(fits)
    head = f"peak {human_bytes(peak)}"
    if fitting:
        tail = f", tight on {_sizes(smaller)} GB" if smaller else ""
        return f"{head}: fits {fitting[0]} GB Macs{tail}"
    if tight:
        return f"{head}: fits no Mac, tight on {_sizes(tight)} GB"
    return f"{head}: does not fit any Mac (the largest has {fits[-1].mac.ram_gb} GB)" if fits else head


def _by_fit(fits: tuple[Fit, ...]) -> tuple[list[int], list[int], list[int]]:
    """RAM sizes that fit, that are tight, and the tight ones smaller than the smallest that fits."""
    fitting = [f.mac.ram_gb for f in fits if f.verdict == "fits"]
    tight = [f.mac.ram_gb for f in fits if f.verdict == "tight"]
    return fitting, tight, [g for g in tight if fitting and g < fitting[0]]


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 3 else f"{sizes[0]}–{sizes[-1]}"


def lane_effect(peak: int, fits: tuple[Fit, ...]) -> dict[str, str]:
    """{fit, reason}: fits (on some Mac) | tight (only tight, on every Mac it runs on) | does_not_fit (no Mac).
    The reason reads as a lane reason: its head, before the first ': ', names the finding."""
    fitting, tight, smaller = _by_fit(fits)
    head = f"memory peak {human_bytes(peak)}"
    if fitting:
        tail = f" (tight on {_sizes(smaller)} GB)" if smaller else ""
        return {"fit": "fits", "reason": f"{head} fits {fitting[0]} GB Macs and larger{tail}"}
    if tight:
        return {"fit": "tight", "reason": f"{head} is tight on every Mac it runs on ({_sizes(tight)} GB): over "
                                          f"{FIT_MARGIN:.0%} of Metal's recommended working set"}
    return {"fit": "does_not_fit", "reason": f"{head} fits no Mac: over PyTorch's MPS hard cap ({HARD_CAP_RATIO} x "
                                             "the recommended working set) or the RAM on every size up to "
                                             f"{fits[-1].mac.ram_gb if fits else 0} GB"}


def batch_line(fits: tuple[Fit, ...], batch: int | None, scaled: bool = True) -> str:
    """'largest batch that fits (traced at 32): 8 GB 12 · 16 GB 40 · …' (empty when the batch could not be
    varied). Macs whose batch is beyond the search's cap MAX_BATCH (null in the JSON) share one cell,
    '32 GB and larger: over 1048576', instead of repeating the cap for each size."""
    if not scaled:
        return ""
    found = [f for f in fits if f.max_batch not in (0, None)]
    cells = [f"{f.mac.ram_gb} GB {f.max_batch}" for f in found]
    beyond = [f for f in fits if f.max_batch is None]
    if beyond:
        cells.append(f"{beyond[0].mac.ram_gb} GB{' and larger' if len(beyond) > 1 else ''}: over {MAX_BATCH}")
    if not cells:
        return ""
    return f"largest batch that fits (traced at {batch}): " + " · ".join(cells)


def _not_sized(scaling: dict[str, Any]) -> str:
    """Why the batch was not sized, when it was not (the sizing runs failed: said, never silent)."""
    note = scaling.get("note") if not scaling.get("points") else None
    return f"largest batch: not sized — {note}" if note else ""


def memory_section(est: Estimate, fits: tuple[Fit, ...], scaling: dict[str, Any], macos: str,
                   bf16_blocked: tuple[str, ...], dtype: str | None) -> dict[str, Any]:
    """The report's `memory` section."""
    peak = est.peak.bytes
    return {
        "basis": BASIS,
        "peak_bytes": peak,
        "line": fit_line(peak, fits),
        "batch_line": batch_line(fits, est.batch, bool(scaling.get("points"))) or _not_sized(scaling),
        "estimate": est.to_dict(),
        "macs": [f.to_dict() for f in fits],
        "batch_scaling": {"varied": "the leading dimension of the input tensors", **scaling},
        "bfloat16": _bf16(est, bf16_blocked, dtype),
        "assumes": {"macos": macos, "fraction_rule": "2/3 of RAM up to 32 GB, 3/4 above (macOS 13-15 reports); "
                    "macOS 26: 0.78 above 32 GB", "hard_cap_ratio": HARD_CAP_RATIO, "fits_below": FIT_MARGIN,
                    "gb": "2**30 bytes", "max_batch_searched": MAX_BATCH},
        "not_counted": list(NOT_COUNTED) + _unsized(est),
        "lane": lane_effect(peak, fits),
    }


def _bf16(est: Estimate, blocked: tuple[str, ...], dtype: str | None) -> dict[str, Any]:
    if dtype:
        return {"peak_bytes": est.peak.bytes, "saving_bytes": 0, "blocked_by": [],
                "note": f"the step already runs in {dtype}"}
    saving = est.peak.bytes - est.bf16_peak
    note = (f"casting the model and inputs to bfloat16 (--dtype bfloat16) would save {human_bytes(saving)}"
            + (": every op has a bfloat16 kernel on MPS" if not blocked else
               f", but {len(blocked)} row(s) have no bfloat16 kernel on MPS"))
    return {"peak_bytes": est.bf16_peak, "saving_bytes": saving, "blocked_by": list(blocked), "note": note}


def _unsized(est: Estimate) -> list[str]:
    if not est.unsized:
        return []
    return [f"{est.unsized} storages whose size depends on tensor values (fake tensors do not know it)"]
