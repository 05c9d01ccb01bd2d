#!/usr/bin/env python3
"""The fake-mps experiment (issue 14; results in docs/fake_mps.md): how far a step gets on tensors that a
FakeTensorMode puts on a *fake* `mps` device of a Linux torch build (no MPS compiled in).

    python tools/fake_mps_experiment.py

Each case runs in its own process (a failure inside autograd's C++ can abort the process: `terminate called
after throwing an instance of 'c10::Error'`), in inference_mode ("infer", no autograd) and with autograd
("grad"), and prints one line per case: ok, or the first line of the error.
"""

from __future__ import annotations

import subprocess
import sys

CASES = {
    "factory (randn)": "torch.randn(2, 3, device=d)",
    "elementwise + broadcast": "torch.randn(2, 4, device=d) + torch.randn(4, device=d)",
    "matmul": "torch.randn(2, 4, device=d) @ torch.randn(4, 3, device=d)",
    "softmax": "torch.randn(2, 4, device=d).softmax(-1)",
    "gelu": "F.gelu(torch.randn(2, 4, device=d))",
    "max_pool2d": "F.max_pool2d(torch.randn(1, 1, 4, 4, device=d), 2)",
    "interpolate": "F.interpolate(torch.randn(1, 1, 4, 4, device=d), scale_factor=2, mode='bilinear')",
    "nn.Embedding": "nn.Embedding(10, 4, device=d)(torch.tensor([1, 2], device=d))",
    "nn.LayerNorm": "nn.LayerNorm(4, device=d)(torch.randn(2, 4, device=d))",
    "nn.Linear": "nn.Linear(4, 4, device=d)(torch.randn(2, 4, device=d))",
    "nn.Conv2d": "nn.Conv2d(3, 4, 3, device=d)(torch.randn(2, 3, 8, 8, device=d))",
    "nn.BatchNorm2d": "nn.BatchNorm2d(3, device=d).eval()(torch.randn(2, 3, 4, 4, device=d))",
    "nn.LSTM": "nn.LSTM(4, 4, device=d)(torch.randn(3, 2, 4, device=d))[0]",
    "F.scaled_dot_product_attention": "F.scaled_dot_product_attention(*[torch.randn(1, 2, 4, 8, device=d)] * 3)",
    "clip_grad_norm_ (Python device branch)": "_clip(d)",
    ".cpu()": "torch.randn(2, device=d).cpu()",
}

CHILD = """
import sys, torch, torch.nn as nn, torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
d = "mps"
def _clip(d):
    p = nn.Parameter(torch.randn(3, device=d)); p.grad = torch.randn(3, device=d)
    return torch.nn.utils.clip_grad_norm_([p], 1.0)
grad = sys.argv[2] == "grad"
with FakeTensorMode():
    if grad:
        out = eval(sys.argv[1])
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
    else:
        with torch.inference_mode():
            out = eval(sys.argv[1])
print("ok", out.device)
"""


def run(expr: str, mode: str) -> str:
    proc = subprocess.run([sys.executable, "-c", CHILD, expr, mode], capture_output=True, text=True, timeout=300)
    if proc.returncode == 0 and proc.stdout.startswith("ok"):
        return proc.stdout.strip()
    err = (proc.stderr or "").splitlines()
    aborted = [ln.strip() for ln in err if ln.strip().startswith("what():")]  # C++ abort: the message
    lines = aborted or [ln for ln in err if "Error" in ln and not ln.startswith("frame #")]
    prefix = f"aborted (exit {proc.returncode}): " if aborted else ""
    return (prefix + (lines[-1] if lines else f"exit {proc.returncode}"))[:150]


def main() -> int:
    import torch

    print(f"torch {torch.__version__}, MPS built: {torch.backends.mps.is_built()}")
    for name, expr in CASES.items():
        print(f"{name:40} infer: {run(expr, 'infer'):60.60} | grad: {run(expr, 'grad')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
