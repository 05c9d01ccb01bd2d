"""The zoo's task: scan one model for every release (in a worker process: the pool's or a Ray task's).

`run_model(model_dict, releases) -> dict` is all a worker runs: build and trace the model (fake tensors first when
its `fake` is "auto", real ones if the build or trace fails under them), judge every release through
zoo.releases.scan_releases, and return the ModelResult's JSON. Anything the model raises becomes the row's
one-line reason; it never ends the run.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from opscan.zoo.board import Cell, ModelResult
from opscan.zoo.models import ZooModel

REASON_CHARS = 240


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, at most REASON_CHARS characters."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:REASON_CHARS]


def options_for(model: ZooModel, fake: bool):
    """The ScanOptions of one model: its target, inputs and step; no memory estimate, no FX pass. A real-tensor try
    never switches to fake tensors by itself (auto_fake off): the models that take real tensors are those whose step
    fake tensors cannot finish (detectors: data-dependent box sampling), and a switch made because the host's free
    RAM was short traced them only up to detector.transform (9 of about 140 rows) and judged that stub."""
    from opscan.scan import ScanOptions

    return ScanOptions(model.target, inputs=model.inputs, args=dict(model.args), inference=model.inference,
                       dtype=model.dtype, fake=fake, auto_fake=False, memory=False, fx=False)


def run_model(model_dict: dict[str, Any], releases: tuple[str, ...] | None) -> dict[str, Any]:
    """Scan one model (ZooModel.to_dict) for `releases` (None: every release); its ModelResult as JSON."""
    from opscan.target.run import RunContext, offline

    offline()
    if not os.environ.get("TORCH_LOGS"):  # torch's fake-tensor logger prints whole tracebacks of what the row says
        logging.getLogger("torch").setLevel(logging.CRITICAL + 1)
    model = ZooModel.from_dict(model_dict)
    start = time.perf_counter()
    tries = {"auto": (True, False), "true": (True,), "false": (False,)}[model.fake]
    error = None
    for fake in tries:
        try:
            results = _scan(model, fake, releases, RunContext())  # one run per model
        except Exception as exc:  # noqa: BLE001 - a model that cannot be scanned is a row with its reason
            error = one_line(exc)  # the last try's reason: real tensors', when fake ones failed first
            continue
        origin = _origin()
        cells = tuple(Cell(r, "predicted", origin) for r in results.values())
        return ModelResult(model, cells, time.perf_counter() - start, None, fake, _made()).to_dict()
    return ModelResult(model, (), time.perf_counter() - start, error, None, _made()).to_dict()


def _made() -> dict[str, str]:
    """The commit and knowledge digest this worker scans with (zoo/provenance.py)."""
    from opscan.zoo.provenance import made_with

    made = made_with()
    return {"commit": made["commit"], "knowledge": made["knowledge"]}


def _scan(model: ZooModel, fake: bool, releases, ctx):
    from opscan.zoo.releases import scan_releases

    return scan_releases(options_for(model, fake), tuple(releases) if releases else None, ctx)


def _origin() -> str:
    from opscan import __version__

    return f"predicted by opscan {__version__} from its knowledge base"
