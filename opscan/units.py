"""Shared: how a byte count is written for people — one formatter for every report, page and message.

Binary units written KB, MB and GB (1 KB = 1024 B, 1 GB = 2**30 B: the way Apple counts unified memory, so
"peak 7.9 GB" and "fits 16 GB Macs" are the same unit), one decimal; whole bytes below 1 KB.
"""

from __future__ import annotations

UNITS = (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10))


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB', 2**30 -> '1.0 GB', 512 -> '512 B' (negative counts keep their sign)."""
    for unit, size in UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
