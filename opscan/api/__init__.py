"""API: opscan from Python, for objects in memory (a notebook's model) — docs/api.md.

- `analyze(model, example_inputs, ...)` scans one training step (or forward) of a model object and returns a
  `NotebookReport`: the Report, which renders itself in Jupyter (api/objects.py; the step runs on copies,
  api/isolation.py);
- `supports(op, dtypes=..., release=..., macos=...)` answers one operator's question as `opscan coverage` does,
  as a frozen `Support` (api/support.py).

The last stage but the CLI: it composes the scan (opscan/scan.py) and the renderers. Importing it imports no torch;
`opscan.analyze` and the rest are re-exported lazily by the package (opscan/__init__.py).
"""

from __future__ import annotations

from opscan.api.isolation import IsolationError
from opscan.api.objects import analyze
from opscan.api.support import Support, supports

__all__ = ["analyze", "supports", "Support", "IsolationError"]
