"""The probe set that settles uncertain silent-bug entries on a Mac: one opscan target per step mode whose step
makes the reporters' repro calls (tests/targets/silent_repros.py) of the entries a measurement can decide, at
their small shapes (no entry over 2**31 elements: those need a Mac with the memory, one repro at a time).

    opscan bundle tools/silent/probe_set.py:forward_set --inference -o silent-forward
    opscan bundle tools/silent/probe_set.py:training_set -o silent-training
    # on the Mac, once per torch release and macOS in question (SETTLE says which):
    python3 -m pip install torch==2.4.1 && ./run.sh          # then: opscan merge results.jsonl --bundle DIR

Measured mode compares every call with the CPU reference: a `mismatch` row on the repro's op at a release an
entry does not cover, or a clean row at one it does, corrects the entry (its `affected`, `fixed_in`, `macos`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

REPROS_FILE = Path(__file__).resolve().parents[2] / "tests" / "targets" / "silent_repros.py"

# entry id -> (step mode, what a run settles: the torch releases and macOS to run the bundle on)
SETTLE = {
    "140902": ("training", "first affected release: 2.4.1 on macOS 14 (before the strided API) and 2.5.1 on macOS 14 "
                           "and 15 — PR #143196 says the channels-last logic it removed was wrong before macOS 15"),
    "141471": ("forward", "first affected release: 2.4.1 and 2.5.1, macOS 14 and 15"),
    "175189": ("training", "first affected release and macOS range: 2.4.1, 2.5.1 and 2.13.0 on macOS 14 and 15"),
    "183825": ("training", "first affected release: 2.10.0, 2.11.0 and 2.12.0"),
    "182822": ("forward", "first affected release: 2.0.1, 2.6.0 and 2.12.0"),
    "183631": ("forward", "regression boundary: 2.11.0 (right per the label) and 2.12.0"),
    "114692": ("forward", "first affected release: 2.0.1 and 2.1.2"),
    "163327": ("forward", "range: 2.6.0, 2.8.0 and 2.14.1 (open)"),
    "118115": ("forward", "range: 2.0.1, 2.2.2 and 2.3.1"),
    "100764": ("forward", "fixed release: 2.0.1 and 2.1.2"),
    "95417": ("forward", "fixed release: 2.0.1 and 2.1.2"),
    "174339": ("forward", "range: 2.9.1, 2.10.0 and 2.14.1 (open)"),
    "156792": ("forward", "range: 2.6.0, 2.7.1 and 2.13.0"),
    "165257": ("forward", "range: 2.1.2, 2.2.2 and 2.10.0"),
    "149951": ("forward", "first affected release: 2.1.2 (fmax's first MPS kernel) and 2.6.0"),
    "151443": ("forward", "first affected release: 2.4.1 (isin's first MPS kernel) and 2.6.0"),
    "188335": ("forward", "first affected release (an OS bug in MPSGraph's conv): 2.4.1, 2.8.0 and 2.12.0; fixed "
                          "release: 2.14.1"),
    "185119": ("training", "first affected release: 2.0.1 and 2.6.0 (the MPSGraph backward's TODO); fixed: 2.13.0"),
    "189565": ("training", "range (open, reproduced on 2.13.0 only): 2.10.0, 2.12.0 and 2.14.1"),
    "190056": ("training", "first affected release: 2.1.2, 2.6.0 and 2.9.1 (a dropout mask needs a fixed seed per "
                           "forward, as the issue does)"),
}


def _repros():
    spec = importlib.util.spec_from_file_location("silent_repros_for_probes", REPROS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ProbeSet(nn.Module):
    """Runs each repro's model on its own inputs; the step's output is the sum of their floating outputs."""

    def __init__(self, models: dict[str, nn.Module]):
        super().__init__()
        self.repros = nn.ModuleDict({f"bug_{i}": m for i, m in models.items()})

    def forward(self, *inputs):
        total = None
        for (name, model), args in zip(self.repros.items(), inputs):
            out = model(*args)
            out = out[0] if isinstance(out, tuple) else out
            if out.is_floating_point():
                value = out.float().sum()
                total = value if total is None else total + value
        return total


def _set(mode: str):
    module = _repros()
    models, inputs = {}, []
    for bug_id, (step, _) in SETTLE.items():
        if step != mode:
            continue
        model, args = getattr(module, f"repro_{bug_id}")()
        models[bug_id] = model
        inputs.append(args if isinstance(args, tuple) else (args,))
    return ProbeSet(models), tuple(inputs)


def forward_set():
    """The forward-only repros of SETTLE (bundle with --inference)."""
    return _set("forward")


def training_set():
    """The repros of SETTLE whose bug is in a backward op (the whole training step)."""
    model, inputs = _set("training")
    model.register_parameter("anchor", nn.Parameter(torch.zeros(())))  # a parameter even when no repro has one
    return model, inputs
