"""Target stage: a step's DataLoader with worker processes, run where opscan runs the step on fake or meta tensors.

A `train_step` may iterate a `torch.utils.data.DataLoader(..., num_workers=N)`. On real tensors its workers
work (the trace keeps them). On fake tensors (the memory stage's sizing runs, a `--fake` trace) they cannot:
the loader draws its workers' base seed with `.item()` on a fake tensor, so each worker gets a symbolic value,
dies in `random.seed`, prints its traceback on the terminal and the step fails with "DataLoader worker exited
unexpectedly". Inside `in_process_loaders()` every DataLoader iterator made runs in this process instead
(as num_workers=0 would: same batches, same order for a sequential sampler), so the step runs on fake tensors
and no worker process is started. Restored on exit: torch's class is patched only while the block runs (one
run at a time per process). `stderr_aside` keeps what processes started in a block print (a worker's traceback)
off the terminal.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def in_process_loaders(seen: list | None = None):
    """DataLoader iterators made inside run their workers' work in this process; `seen` gets one entry per
    loader with workers that was run so."""
    from torch.utils.data import DataLoader
    from torch.utils.data import dataloader as module

    original = DataLoader._get_iterator

    def single_process(self):
        workers = self.num_workers
        if workers == 0:
            return original(self)
        if seen is not None:
            seen.append(workers)
        self.num_workers = 0  # read once, by the iterator's constructor
        try:
            return module._SingleProcessDataLoaderIter(self)
        finally:
            self.num_workers = workers

    DataLoader._get_iterator = single_process
    try:
        yield seen
    finally:
        DataLoader._get_iterator = original


@contextlib.contextmanager
def stderr_aside(captured: list):
    """Descriptor 2 (and so whatever a process started inside writes there: a worker's traceback) goes to a
    temporary file while the block runs; its text is appended to `captured` afterwards. For runs that repeat a
    step the trace already ran in view of the user (the memory stage's sizing runs)."""
    import os
    import sys
    import tempfile

    with tempfile.TemporaryFile() as sink:
        _flush(sys.stderr)
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            _flush(sys.stderr)
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", "replace"))


def _flush(stream) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        stream.flush()
