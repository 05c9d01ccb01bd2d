"""opscan: operator-coverage scanner for PyTorch training steps on Apple Silicon (MPS).

Importing this package must stay cheap: torch is imported lazily by the stages that need it,
so `opscan --help` answers without loading torch. The Python API (docs/api.md) is re-exported here
lazily, on first use: `opscan.analyze`, `opscan.supports`, `opscan.Report`, ...
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first access (PEP 562): named as strings so that the
# package, the shared spine, imports no stage until the API is used
_API = {
    "analyze": "opscan.api.objects",
    "supports": "opscan.api.support",
    "Support": "opscan.api.support",
    "IsolationError": "opscan.api.isolation",
    "Report": "opscan.report",
    "Row": "opscan.report",
    "NotebookReport": "opscan.render.notebook",
    "Verdict": "opscan.verdict",
    "Evidence": "opscan.verdict",
    "OpscanError": "opscan.errors",
}
__all__ = ["__version__", "analyze", "supports", "Support", "IsolationError", "Report", "Row", "NotebookReport",
           "Verdict", "Evidence", "OpscanError"]  # the names of _API, checked by tests/test_api.py


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'opscan' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
