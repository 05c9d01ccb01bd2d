"""Knowledge: the AutocastMPS policy and GradScaler's MPS path of each covered torch release (autocast_mps.txt).

The table is written by tools/build_autocast_mps.py from each release's macOS arm64 wheel (its docstring says
what is read where). One group per run of releases that read the same:

    == 2.9.0 2.9.1
    available: yes                       # torch.autocast("mps") accepted (else `raises: <the error>`)
    dtypes: bfloat16 float16             # what it accepts; `other_dtype`: what it does with another
    bfloat16_macos: 14.0                 # the Python check that disables bfloat16 below macOS 14 (- | unreachable)
    default_dtype: float16               # torch.get_autocast_dtype("mps")
    gradscaler: mps-branch torch/amp/grad_scaler.py:338   # GradScaler.unscale_ on an mps scale (absent | double)
    lower_precision_fp (26): conv1d ...  # m.impl(op, WrapFunction<CastPolicy::P, DeviceType::MPS, ...>)
    fp32 (65): ...
    promote (10): ...

An op without a line has no AutocastMPS kernel: the fallthrough runs it on the dtypes it is given. Pure: no torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from opscan.opkey import Release

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autocast_mps.txt")
FIELDS = ("available", "raises", "dtypes", "other_dtype", "bfloat16_macos", "default_dtype", "gradscaler",
          "registrations")
POLICIES = ("lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote")
TABLE_HEADER = """\
# The AutocastMPS policy of each covered torch release, and how GradScaler.unscale_ treats an MPS scale, read
# from its macOS arm64 wheel by tools/build_autocast_mps.py (libtorch_cpu.dylib: the TORCH_LIBRARY_IMPL(aten|_,
# AutocastMPS) bodies, each m.impl's op string and WrapFunction_<CastPolicy, DeviceType> kernel, the
# autocast_dtype thread-local template; torch/include/ATen/autocast_mode.h: the CastPolicy order;
# torch/amp/autocast_mode.py: the device and dtype checks of torch.autocast; torch/amp/grad_scaler.py: unscale_).
# Read by opscan/knowledge/autocast.py, whose docstring explains the fields. An op not listed has no AutocastMPS
# kernel: the fallthrough runs it on the dtypes it is given. lower_precision_fp: floating inputs cast to the
# autocast dtype; fp32: cast to float32; promote: cast to the widest floating input type.
"""
ENABLED, DISABLED, RAISES = "enabled", "disabled", "raises"


@dataclass(frozen=True)
class AutocastGroup:
    """One group of the table: its releases, its fields (FIELDS) and op -> cast policy."""

    releases: tuple[str, ...]
    fields: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AutocastPolicy:
    """What torch.autocast("mps") and GradScaler do on a Mac in one release (see the module docstring)."""

    release: str
    group: AutocastGroup

    @property
    def available(self) -> bool:
        """Does torch.autocast("mps") exist (not raise) in the release?"""
        return self.group.fields.get("available") == "yes"

    @property
    def default_dtype(self) -> str:
        """torch.get_autocast_dtype("mps") (float16 where autocast exists)."""
        return self.group.fields.get("default_dtype", "-")

    @property
    def gradscaler(self) -> str:
        """GradScaler.unscale_ on an mps scale: "absent", "double" or "mps-branch"."""
        return self.group.fields.get("gradscaler", "absent").split()[0]

    @property
    def source(self) -> str:
        """Where the group's facts come from."""
        first, last = self.group.releases[0], self.group.releases[-1]
        span = first if first == last else f"{first}..{last}"
        return (f"opscan/knowledge/autocast_mps.txt (torch {span}: macOS arm64 wheels, libtorch_cpu.dylib "
                f"TORCH_LIBRARY_IMPL(aten, AutocastMPS) and torch/amp/; tools/build_autocast_mps.py)")

    def cast(self, op: str) -> str | None:
        """The cast policy of `op` (yaml spelling, "softmax.int"), None when it has no AutocastMPS kernel."""
        return self.group.ops.get(op)

    def gate(self, dtype: str | None, macos: tuple[int, int]) -> str:
        """What `torch.autocast("mps", dtype=dtype)` does on macOS `macos`: "enabled <dtype>", "disabled <why>"
        or "raises <error>" (no release number in the text: releases that answer alike share a trace)."""
        fields = self.group.fields
        if not self.available:
            return f"{RAISES} {fields.get('raises', 'RuntimeError')}"
        dtype = dtype or self.default_dtype
        accepted = fields.get("dtypes", "").split()
        if dtype not in accepted:
            return (f"{DISABLED} accepts only {' and '.join(accepted)} for MPS autocast: with {dtype} torch.autocast "
                    f"{fields.get('other_dtype', 'disables autocast')}")
        if dtype == "bfloat16" and fields.get("bfloat16_macos") == "14.0" and tuple(macos) < (14, 0):
            return (f"{DISABLED} disables bfloat16 MPS autocast below macOS 14 (torch.autocast warns 'In MPS "
                    "autocast, but the target dtype torch.bfloat16 is not supported on macOS versions below 14. "
                    "Disabling autocast.')")
        return f"{ENABLED} {dtype}"


def parse_autocast_table(text: str) -> list[AutocastGroup]:
    """The groups of autocast_mps.txt's text."""
    groups: list[AutocastGroup] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("== "):
            groups.append(AutocastGroup(tuple(line[3:].split())))
            continue
        key, _, value = line.partition(":")
        name = key.split(" (")[0]
        if name in POLICIES:
            groups[-1].ops.update({op: name for op in value.split()})
        elif name in FIELDS:
            groups[-1].fields[name] = value.strip()
        else:
            raise ValueError(f"autocast_mps.txt: unknown line {raw!r}")
    return groups


def format_autocast_table(groups: list[AutocastGroup]) -> str:
    """autocast_mps.txt's text (parse_autocast_table reads it back)."""
    lines = [TABLE_HEADER]
    for group in groups:
        lines.append("== " + " ".join(group.releases))
        lines.extend(f"{name}: {group.fields[name]}" for name in FIELDS if name in group.fields)
        for policy in POLICIES:
            ops = sorted(op for op, p in group.ops.items() if p == policy)
            if ops:
                lines.append(f"{policy} ({len(ops)}): {' '.join(ops)}")
        lines.append("")
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def load_table(path: str = TABLE_PATH) -> tuple[AutocastGroup, ...]:
    """The shipped table (cached)."""
    with open(path, encoding="utf-8") as fh:
        return tuple(parse_autocast_table(fh.read()))


def policy_of(release: str, path: str = TABLE_PATH) -> AutocastPolicy | None:
    """The policy of `release` ("2.14.1"; a local build's suffix is dropped), None when the table lacks it."""
    plain = Release.drop_local(release)
    for group in load_table(path):
        if plain in group.releases:
            return AutocastPolicy(plain, group)
    return None


def all_ops(path: str = TABLE_PATH) -> frozenset[str]:
    """Every op some release's AutocastMPS policy lists (yaml spelling)."""
    return frozenset(op for group in load_table(path) for op in group.ops)

