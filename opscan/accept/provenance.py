"""Accept stage (provenance): the environment record of an acceptance run — versions and both devices."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

import torch

from opscan import __version__

PACKAGES = ("torch", "torchvision", "transformers", "timm", "numpy", "opscan")


def environment(options) -> dict[str, Any]:
    """Where the run happened: versions, the command, and a record per device (target, reference)."""
    from opscan.probe.backends import environment_record

    from opscan.target.inputs import redacted_argv

    argv = ["opscan", *redacted_argv(sys.argv[1:], options.public_args)] if sys.argv[1:2] == ["accept"] else None
    return {"opscan": __version__, "command": argv,  # --arg values only for --public-arg names
            "packages": _versions(), "seed": options.spec.seed,
            "target": {**environment_record("accept", options.device), **_device(options.device),
                       "dtype": options.dtype},
            "reference": {**environment_record("accept", options.reference), **_device(options.reference),
                          "dtype": "float32"},
            "numerics": {"allow_tf32": options.allow_tf32, "cudnn_deterministic": True, "cudnn_benchmark": False,
                         "threads": torch.get_num_threads()}}


def _versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _device(name: str) -> dict[str, Any]:
    """What the device says about itself (cuda: name, capability, CUDA and cuDNN versions)."""
    if not name.startswith("cuda") or not torch.cuda.is_available():
        return {}
    index = torch.device(name).index or 0
    return {"cuda_device": torch.cuda.get_device_name(index),
            "cuda_capability": list(torch.cuda.get_device_capability(index)),
            "cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version()}
