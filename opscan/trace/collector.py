"""Trace stage: keep Python's cyclic garbage collector off the objects that outlive a scan's stages.

A scan makes hundreds of thousands of container objects (each call's record, tensor metadata and arguments)
on top of the ~400k that importing torch and transformers leaves behind, and every full collection walks
all of them: on a 7B step that was about 2 s of CPU, a fifth of the scan. `spared()` calls `gc.freeze()` on
entry: everything alive then (the imports, the model, the trace made so far) moves to the permanent
generation, which collections skip; what the block makes is collected as usual. The outermost block
calls `gc.unfreeze()` on exit, so the frozen objects go back to the oldest generation and nothing frozen
stays uncollectable after the scan. Blocks nest; an inner one freezes again (what the outer block made
by then, such as the trace before the memory stage) and leaves the unfreezing to the outermost. (The CLI
process freezes everything once more just before it ends: the interpreter's final collection then skips
it all, about 2 s of teardown after a 7B scan.)

No result depends on the collector's timing: the memory tracker counts the moments storages are freed
(weakref callbacks), and the tensors of a step are freed by reference counting, when their last reference
goes; the reports of the example models and of 7B/70B fake scans are byte-identical with and without it.
"""

from __future__ import annotations

import contextlib
import gc

_depth = 0


@contextlib.contextmanager
def spared():
    """Freeze what is alive now for the duration of the block (see the module docstring)."""
    global _depth
    gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
