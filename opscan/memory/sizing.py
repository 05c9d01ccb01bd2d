"""Memory stage: which Macs the step fits, and the largest batch on each (pure).

The limits (mps_facts.md §7): Metal's `recommendedMaxWorkingSetSize` is a fraction of the Mac's RAM —
reported as 2/3 on 8, 16 and 32 GB Macs and 3/4 on a 64 GB one under macOS 13–15 (the fraction
assumed here), not reported for the other sizes (the same pattern is assumed: 2/3 up to 32 GB, 3/4
above). macOS 26 reports more (0.78 on a 48 GB Mac, 0.84 on a 128 GB one), so with `--macos 26` the
Macs above 32 GB use 0.78; `sudo sysctl iogpu.wired_limit_mb` changes it on any Mac. PyTorch's MPS
allocator refuses allocations beyond its hard cap, 1.7 x that value (PYTORCH_MPS_HIGH_WATERMARK_RATIO),
which on small Macs is more than the RAM (it then swaps instead).

Verdicts: **fits** — the peak is at most 90% of the recommended working set (the estimate counts
tensor bytes; the allocator's caching and rounding and MPSGraph's own buffers come on top);
**tight** — above that, but under the hard cap and the RAM: it runs, beyond what Metal recommends
(memory pressure, swapping); **does not fit** — beyond the hard cap or the RAM.

The largest batch: the sizing runs (batch.py) give each allocation event a line c + s * batch; the
step's peak at batch b is the highest of those lines (shifted to pass through the traced estimate),
and the largest b whose peak fits is found by bisection.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1024**3  # Apple's "16 GB" is 16 GiB; every "GB" in opscan's memory figures is 2**30 bytes
HARD_CAP_RATIO = 1.7
FIT_MARGIN = 0.9
MACOS26_FRACTION = 0.78
MAX_BATCH = 1 << 20  # larger batches are reported as null: 'at least this', never computed


@dataclass(frozen=True)
class Mac:
    """One Mac memory size and the working-set fraction assumed for it, with where it comes from."""

    ram_gb: int
    fraction: float
    basis: str  # reported | inferred
    source: str


_TWO_THIRDS, _THREE_QUARTERS = 2 / 3, 3 / 4
_PATTERN = "inferred from the reported sizes (2/3 up to 32 GB, 3/4 above; mps_facts.md §7)"
MACS = (
    Mac(8, _TWO_THIRDS, "reported", "~5.3 GB: SceneWorks/SceneWorks PR #1552"),
    Mac(16, _TWO_THIRDS, "reported", "10922.67 MB: abetlen/llama-cpp-python #687, ggml-org/llama.cpp #2209"),
    Mac(24, _TWO_THIRDS, "inferred", _PATTERN),
    Mac(32, _TWO_THIRDS, "reported", "21845.34 MB: ggml-org/llama.cpp #2011, #3606"),
    Mac(36, _THREE_QUARTERS, "inferred", _PATTERN),
    Mac(48, _THREE_QUARTERS, "inferred", _PATTERN + "; 0.78 reported on macOS 26"),
    Mac(64, _THREE_QUARTERS, "reported", "49152 MiB: ggml-org/llama.cpp #1870"),
    Mac(96, _THREE_QUARTERS, "inferred", _PATTERN),
    Mac(128, _THREE_QUARTERS, "inferred", _PATTERN + "; 0.84 reported on macOS 26"),
    Mac(192, _THREE_QUARTERS, "inferred", _PATTERN),
    Mac(256, _THREE_QUARTERS, "inferred", _PATTERN),
    Mac(512, _THREE_QUARTERS, "inferred", _PATTERN),
)


def for_macos(mac: Mac, macos_major: int) -> Mac:
    """The Mac as the assumed macOS reports it (macOS 26: 0.78 above 32 GB; no reports below)."""
    if macos_major >= 26 and mac.ram_gb > 32:
        return Mac(mac.ram_gb, MACOS26_FRACTION, "reported",
                   "macOS 26: 0.78 (48 GB) to 0.84 (128 GB) reported; the lower is assumed")
    return mac


def verdict(peak: int, mac: Mac) -> str:
    """fits, tight or does_not_fit (see the module docstring)."""
    recommended = mac.fraction * mac.ram_gb * GB
    if peak <= FIT_MARGIN * recommended:
        return "fits"
    if peak <= min(HARD_CAP_RATIO * recommended, mac.ram_gb * GB):
        return "tight"
    return "does_not_fit"


@dataclass(frozen=True)
class Curve:
    """The step's peak as a function of the batch: the highest of `lines` (c, s) plus `offset`."""

    lines: tuple[tuple[float, float], ...]
    offset: float = 0.0

    def at(self, batch: float) -> float:
        """Peak bytes at this batch."""
        return max(c + s * batch for c, s in self.lines) + self.offset

    def largest(self, limit: float) -> int | None:
        """The largest batch whose peak is at most `limit`: 0 when even batch 1 is over, None when the
        peak does not grow with the batch (it never stops fitting, or never fits)."""
        if self.at(1) > limit:
            return 0
        if max(s for _, s in self.lines) <= 0:
            return None
        low, high = 1, 2
        while self.at(high) <= limit:
            low, high = high, high * 2
            if high > MAX_BATCH:
                return None
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.at(mid) <= limit else (low, mid)
        return low


def fit_curve(runs: tuple[tuple[int, tuple[int, ...]], ...], batch: int, peak: int) -> Curve | None:
    """Lines through two sizing runs ((batch, curve) pairs), shifted so the curve passes through the
    traced (batch, peak). Event by event when both runs made the same allocations; else the peaks."""
    if len(runs) < 2:
        return None
    (b1, v1), (b2, v2) = runs[0], runs[1]
    pairs = list(zip(v1, v2)) if len(v1) == len(v2) else [(max(v1, default=0), max(v2, default=0))]
    lines = _upper(tuple((y1 - (y2 - y1) / (b2 - b1) * b1, (y2 - y1) / (b2 - b1)) for y1, y2 in pairs))
    curve = Curve(lines)
    return Curve(lines, peak - curve.at(batch))


def _upper(lines: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """The lines that are highest somewhere at batch >= 1 (their upper envelope), so `at` stays cheap."""
    best: dict[float, float] = {}
    for c, s in lines:
        best[s] = max(best.get(s, c), c)
    hull: list[tuple[float, float]] = []  # (slope, intercept), slopes rising
    for s, c in sorted(best.items()):
        while len(hull) >= 2 and _crossing(hull[-2], (s, c)) <= _crossing(hull[-2], hull[-1]):
            hull.pop()  # the new line overtakes hull[-2] before hull[-1] does: hull[-1] is never highest
        hull.append((s, c))
    while len(hull) >= 2 and _crossing(hull[0], hull[1]) <= 1:
        hull.pop(0)  # highest only below batch 1
    return tuple((c, s) for s, c in hull)


def _crossing(a: tuple[float, float], b: tuple[float, float]) -> float:
    (s1, c1), (s2, c2) = a, b
    return (c1 - c2) / (s2 - s1) if s2 != s1 else float("-inf")


@dataclass(frozen=True)
class Fit:
    """One row of the sizing table."""

    mac: Mac
    verdict: str
    max_batch: int | None
    max_batch_under_cap: int | None
    bf16_verdict: str
    bf16_max_batch: int | None

    def to_dict(self) -> dict:
        """JSON form."""
        recommended = self.mac.fraction * self.mac.ram_gb * GB
        return {"ram_gb": self.mac.ram_gb, "recommended_bytes": int(recommended),
                "fraction": round(self.mac.fraction, 4), "fraction_basis": self.mac.basis,
                "fraction_source": self.mac.source, "hard_cap_bytes": int(HARD_CAP_RATIO * recommended),
                "verdict": self.verdict, "max_batch": self.max_batch, "max_batch_under_cap": self.max_batch_under_cap,
                "bfloat16": {"verdict": self.bf16_verdict, "max_batch": self.bf16_max_batch}}


def size_macs(peak: int, bf16_peak: int, curve: Curve | None, bf16_curve: Curve | None,
              macos_major: int) -> tuple[Fit, ...]:
    """The sizing table: every Mac of MACS as the assumed macOS reports it."""
    rows = []
    for base in MACS:
        mac = for_macos(base, macos_major)
        recommended = mac.fraction * mac.ram_gb * GB
        runs_limit = min(HARD_CAP_RATIO * recommended, mac.ram_gb * GB)
        rows.append(Fit(
            mac=mac, verdict=verdict(peak, mac),
            max_batch=curve.largest(FIT_MARGIN * recommended) if curve else None,
            max_batch_under_cap=curve.largest(runs_limit) if curve else None,
            bf16_verdict=verdict(bf16_peak, mac),
            bf16_max_batch=bf16_curve.largest(FIT_MARGIN * recommended) if bf16_curve else None,
        ))
    return tuple(rows)
