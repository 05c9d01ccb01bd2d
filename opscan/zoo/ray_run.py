"""The zoo on Ray (`--ray auto|ADDRESS`): the same task (task.run_model) as Ray tasks.

`ray.init(address=...)` joins the cluster (`auto`: the running one if there is one, else a local instance; this
process's own ray.init, e.g. a test's, is reused). Each model is one `ray.remote` task (max_retries=0, one CPU);
at most as many tasks are in flight as the cluster has CPUs, so a task's time limit counts from about when it
starts, and results are consumed as they finish with `ray.wait`. A task that fails for any reason — its worker
died, its node was lost, it raised, or it ran past `timeout` and was cancelled (ray.cancel(force=True)) —
becomes that model's error row. Ray schedules; nothing here does more than keep the window full.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from opscan.errors import UsageError
from opscan.zoo.models import ZooModel
from opscan.zoo.pool import error_row
from opscan.zoo.task import one_line


def connect(address: str):
    """The ray module, connected to `address` (UsageError when ray is missing or the cluster unreachable)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'opscan[ray]' (or drop --ray for the local pool)") from None
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "auto" else address, include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"--ray {address}: cannot join the Ray cluster ({one_line(exc)})") from None
    return ray


def run_ray(models: list[ZooModel], releases: tuple[str, ...] | None, address: str, timeout: float,
            on_result: Callable[[dict], None]) -> None:
    """Scan every model as a Ray task, handing each result dict to `on_result` as it finishes."""
    ray = connect(address)
    from opscan.zoo.task import run_model

    remote = ray.remote(num_cpus=1, max_retries=0)(run_model)
    window = max(1, int(ray.cluster_resources().get("CPU", 1)))
    todo, running = list(reversed(models)), {}
    while todo or running:
        while todo and len(running) < window:
            model = todo.pop()
            running[remote.remote(model.to_dict(), releases)] = (model, time.monotonic())
        left = min(started + timeout for _, started in running.values()) - time.monotonic()
        done, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, left))
        for ref in done:
            model, started = running.pop(ref)
            on_result(_outcome(ray, ref, model, time.monotonic() - started))
        _cancel_overdue(ray, running, timeout, on_result)


def _outcome(ray, ref, model: ZooModel, seconds: float) -> dict[str, Any]:
    try:
        return ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - a lost or failed task is that model's error row
        return error_row(model, f"RayTaskLost: {one_line(exc)}", seconds)


def _cancel_overdue(ray, running: dict, timeout: float, on_result: Callable[[dict], None]) -> None:
    now = time.monotonic()
    for ref, (model, started) in list(running.items()):
        if now - started >= timeout:
            ray.cancel(ref, force=True)
            del running[ref]
            on_result(error_row(model, f"Timeout: no result after {timeout:g} s (--timeout)", now - started))
