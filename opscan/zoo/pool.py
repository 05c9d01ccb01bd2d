"""The zoo's default engine: a local pool of worker processes, each reused for model after model (torch is
imported once per worker), with a time limit per model.

Each worker is a `multiprocessing` spawn process that runs task.run_model for one model at a time. The pool
waits on the workers' pipes and process sentinels together (multiprocessing.connection.wait): a result is handed
to `on_result` as it arrives; a worker that dies (a segfault, an abort, the OOM killer) or runs past `timeout`
is killed and replaced, and only its model becomes an error row with the reason. concurrent.futures'
ProcessPoolExecutor cannot do that: one dead worker breaks the whole pool, and a hung task cannot be stopped.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from opscan.probe.runner import THREADS_VAR
from opscan.zoo.board import ModelResult
from opscan.zoo.models import ZooModel



def error_row(model: ZooModel, reason: str, seconds: float) -> dict[str, Any]:
    """The row of a model that produced no result (its worker died or ran out of time)."""
    return ModelResult(model, (), seconds, reason[:240]).to_dict()


def _worker(conn, threads: int) -> None:
    """A worker's life: run one model per message until told to stop (None) or the parent is gone."""
    os.environ.setdefault(THREADS_VAR, str(threads))
    import torch

    torch.set_num_threads(threads)
    from opscan.zoo.task import run_model

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        conn.send(run_model(*message))


@dataclass
class _Slot:
    process: Any = None
    conn: Any = None
    model: ZooModel | None = None
    started: float = 0.0


class LocalPool:
    """`workers` reused processes; `run(models, on_result)` scans every model, handing each result dict to
    `on_result` as it arrives (errors included)."""

    def __init__(self, workers: int, timeout: float, releases: tuple[str, ...] | None):
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")
        self.workers, self.timeout, self.releases = max(1, workers), timeout, releases
        self.threads = max(1, (os.cpu_count() or 1) // self.workers)

    def run(self, models: list[ZooModel], on_result: Callable[[dict], None]) -> None:
        todo, slots = deque(models), [_Slot() for _ in range(min(self.workers, len(models)))]
        try:
            while todo or any(s.model for s in slots):
                for slot in slots:
                    if slot.model is None and todo:
                        self._assign(slot, todo.popleft())
                self._collect(slots, on_result)
        finally:
            for slot in slots:
                self._stop(slot)

    def _assign(self, slot: _Slot, model: ZooModel) -> None:
        if slot.process is None or not slot.process.is_alive():
            parent, child = self.context.Pipe()
            slot.process = self.context.Process(target=_worker, args=(child, self.threads), daemon=True)
            slot.process.start()
            child.close()
            slot.conn = parent
        slot.model, slot.started = model, time.monotonic()
        slot.conn.send((model.to_dict(), self.releases))

    def _collect(self, slots: list[_Slot], on_result: Callable[[dict], None]) -> None:
        busy = [s for s in slots if s.model is not None]
        now = time.monotonic()
        left = min(s.started + self.timeout - now for s in busy)
        ready = set(wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=max(0.0, left)))
        now = time.monotonic()
        for slot in busy:
            result = self._result(slot, ready, now)
            if result is not None:
                slot.model = None
                on_result(result)

    def _result(self, slot: _Slot, ready: set, now: float) -> dict | None:
        seconds = now - slot.started
        if slot.conn in ready:
            try:
                return slot.conn.recv()
            except (EOFError, OSError):
                pass  # it died while answering: below
        if slot.conn in ready or slot.process.sentinel in ready:
            slot.process.join(5)
            code = slot.process.exitcode
            self._stop(slot)
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            return error_row(slot.model, f"WorkerDied: the worker process scanning it died ({how})", seconds)
        if seconds >= self.timeout:
            self._stop(slot)
            return error_row(slot.model, f"Timeout: no result after {self.timeout:g} s (--timeout)", seconds)
        return None

    @staticmethod
    def _stop(slot: _Slot) -> None:
        if slot.process is None:
            return
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        if slot.conn is not None:
            slot.conn.close()
        slot.process, slot.conn = None, None
