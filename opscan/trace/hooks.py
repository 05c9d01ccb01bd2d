"""Trace stage: where the lens (lens.py) plugs into torch, while one is active.

- Kernels for the lens's composite ops at the autograd keys (AutogradCPU, AutogradMeta), where a
  CompositeImplicitAutograd op is decomposed (its span ops, whose calls it only records, there alone),
  and at the CPU backend key, which a call reaches under
  `torch.inference_mode` when a dispatch mode re-dispatches it (torch refuses a Meta kernel for a CIA
  op; on meta, attention's CIA kernel takes the math path anyway: meta has no `_fused_sdp_choice`
  entry). A direct registration wins over the CIA kernel for that key (mps_facts.md §8,
  OperatorEntry.cpp); each kernel hands the call to the active lens, or runs the CIA kernel when none
  is active. They are registered when the
  first lens is entered and removed when the last one leaves, so a process that is not tracing
  runs torch unchanged.
- the Python-level device branches of branches.py, replaced by the branch MPS takes.

The inference fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer stay off while a
TorchFunctionMode is on (trace/functions.py: the trace's one mode is that gate).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from opscan.trace.branches import Patched
from opscan.trace.guard import call_through

CIA_KEY = DispatchKey.CompositeImplicitAutograd
LENS_KEYS = ("AutogradCPU", "AutogradMeta", "CPU")
_ACTIVE: list = []  # the lenses entered, innermost last (one trace at a time per process)
_LIBRARY: list = []  # the torch.library.Library and the Python rows (branches.py) while a lens is active


def activate(lens, ops: tuple[str, ...], spans: tuple[str, ...] = ()) -> None:
    """Make `lens` the one the kernels hand calls to (registering them for `ops` on first use, and for the span ops
    `spans` at the autograd keys: under inference_mode such a call reaches the recorder, which hands it over)."""
    if not _LIBRARY:
        library = torch.library.Library("aten", "IMPL")
        for name in ops:
            op = _overload(name)
            for key in LENS_KEYS:
                library.impl(name, _kernel(name, op), key)
        for name in (s for s in spans if s not in ops and (op := _overload(s, None)) is not None and _cia(op)):
            for key in LENS_KEYS[:2]:
                library.impl(name, _span_kernel(name, op), key)
        _LIBRARY.extend((library, Patched(_steered, _rows_on, _asked, _release_at_least).__enter__()))
    _ACTIVE.append(lens)


def deactivate(lens) -> None:
    """Forget `lens`; the kernels go when no lens is left."""
    _ACTIVE.remove(lens)
    if not _ACTIVE and _LIBRARY:
        _LIBRARY.pop().__exit__(None, None, None)
        _LIBRARY.pop()._destroy()


def _steered(row, run):
    return _ACTIVE[-1].steered(row, run)


def _asked(question):
    return _ACTIVE[-1].release.ask(question) if _ACTIVE and _ACTIVE[-1].release is not None else None


def _rows_on() -> bool:
    return bool(_ACTIVE and _ACTIVE[-1].table)


def _release_at_least(version: tuple[int, int]) -> bool:
    return _ACTIVE[-1].release.release_at_least(version)


def run_composite(func, args, kwargs):
    """Run a CompositeImplicitAutograd op's kernel, through the active lens when it is one of its ops
    (the recorder under inference_mode, where the autograd-key kernels are skipped)."""
    name = _name(func)
    return _handed(name, lambda: call_through(func._op_dk, CIA_KEY, *args, **kwargs), args, kwargs)


def _kernel(name: str, op):
    def kernel(*args, **kwargs):
        return _handed(name, lambda: call_through(op._op_dk, CIA_KEY, *args, **kwargs), args, kwargs)
    return kernel


def _span_kernel(name: str, op):
    def kernel(*args, **kwargs):
        run = lambda: call_through(op._op_dk, CIA_KEY, *args, **kwargs)  # noqa: E731
        return _ACTIVE[-1].span(name, run, args, kwargs) if _ACTIVE and name in _ACTIVE[-1].spans else run()
    return kernel


def _handed(name: str, run, args, kwargs):
    """A lens row's op to the lens's decision; a span op (Lens.spans) run with its span recorded; else `run()`."""
    if not _ACTIVE:
        return run()
    lens = _ACTIVE[-1]
    if name in lens.table:
        return lens.dispatch(name, run, args, kwargs)
    return lens.span(name, run, args, kwargs) if name in lens.spans else run()


def _cia(op) -> bool:
    """True for an op whose CompositeImplicitAutograd kernel is what the autograd keys run (no kernel of its own
    there, which a span kernel would replace)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(op.name(), CIA_KEY) and not any(has(op.name(), key) for key in ("AutogradCPU", "Autograd"))


_MISSING = object()


def _overload(name: str, default=_MISSING):
    """The aten OpOverload of a yaml name (`default` when this torch lacks it; else AttributeError)."""
    packet, _, overload = name.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, packet), overload or "default")
    except AttributeError:
        if default is _MISSING:
            raise
        return default


def _name(func) -> str:
    overload = func._overloadname
    return func._opname if overload == "default" else f"{func._opname}.{overload}"
