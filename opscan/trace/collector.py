"""Trace stage: keep Python's cyclic garbage collector out of a scan's way.

A scan makes hundreds of thousands of container objects (each call's record, tensor metadata and arguments,
the step graph) on top of the ~400k that importing torch and transformers leaves behind. Collections are
triggered by allocation counts, and every full one walks all of them: about 2 s of CPU on a 7B step, 2.5 s
on a 70B one, for little garbage (the step graph's build alone triggered five full passes that freed
nothing). `spared()` calls `gc.freeze()` on entry: everything alive then (the imports, the model, the trace
made so far) moves to the permanent generation, which no collection walks; and it turns automatic
collection off for the block. The outermost block calls `gc.unfreeze()` and turns collection back on (if it
was on) on exit, so the frozen objects go back to the oldest generation, nothing frozen stays uncollectable
after the scan, and the cyclic garbage the block made (closures of torch's pytree walks, module copies of
the sizing runs: tens of MB at 70B) is collected by the next collection. Blocks nest; an inner one freezes
again (what the outer block made by then, such as the trace before the memory stage) and leaves the rest
to the outermost. (The CLI process freezes everything once more just before it ends: the interpreter's
final collection then skips it all, about 2 s of teardown after a 7B scan.)

No result depends on the collector: the memory tracker counts the moments storages are freed (weakref
callbacks), and the tensors of a step are freed by reference counting, when their last reference goes; the
reports of the example models and of 7B/70B fake scans are byte-identical with and without it.
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
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
        if was_enabled:
            gc.enable()
