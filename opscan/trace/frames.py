"""Trace stage: which torch Python functions issued a dispatched call, and from which line outside torch.

`where(frame)` walks the Python stack outward from the frame that received a call (the recorder's) once:
- frames of opscan itself, of the standard library and of torch's dispatch, mode and call plumbing (MACHINERY:
  OpOverload, TorchDispatchMode, torch-function handling, dynamo-disable wrappers, grad-mode decorators,
  nn.Module's `__call__`) are passed over: they issue no op of their own;
- the torch functions met before the first frame outside torch form the call's `py` chain, innermost first (the
  function that issued the call, then its callers inside torch, up to the one the step's code called: the
  *entry*), one entry per unit ("file:qualname" up to ".<locals>", file relative to site-packages), consecutive
  repeats merged; decorator wrappers around the entry (nested functions outside it: `_no_grad_wrapper`,
  `profile_hook_step`'s wrapper) are left out, so the last unit is the function the step's code named;
- the autograd engine's frame (`_engine_run_backward`) ends the walk: what the engine runs is decided in C++
  (derivatives.yaml), not by the Python functions that called `backward()` (a Python backward above it, an
  autograd.Function of torch's, still issues its own calls), and the line that matters for a backward call is
  the forward call that made its node, not the `backward()` line, so such a call has no `caller`;
- the first frame outside torch and opscan is the call's `caller` (file, line): the step's code or the library
  (transformers, timm, torchvision) that called torch. Issue 29 walks on from there to the user's own file.

Each code object is classified once (`_KINDS`, keyed by identity), so a call costs one dictionary lookup per frame
passed.
"""

from __future__ import annotations

import os
import sysconfig

import torch

import opscan

SKIP, TORCH, ENGINE, OTHER = 0, 1, 2, 3
# torch files and units whose frames issue no op of their own: the dispatch machinery and call plumbing
MACHINERY = ("torch/_ops.py", "torch/overrides.py", "torch/utils/_python_dispatch.py", "torch/_subclasses/",
             "torch/_dynamo/", "torch/_compile.py", "torch/utils/_contextlib.py", "torch/autograd/grad_mode.py",
             "torch/_jit_internal.py", "torch/fx/", "torch/utils/hooks.py", "torch/utils/_pytree.py",
             "torch/_prims_common/", "torch/_prims/", "torch/_refs/", "torch/_meta_registrations.py",
             "torch/_library/fake_impl.py", "torch/autograd/function.py", "torch/_C/")
MACHINERY_UNITS = frozenset({"torch/nn/modules/module.py:Module._call_impl",
                             "torch/nn/modules/module.py:Module._wrapped_call_impl",
                             "torch/autograd/profiler.py:record_function.__enter__",
                             "torch/autograd/profiler.py:record_function.__exit__"})
ENGINE_UNIT = "torch/autograd/graph.py:_engine_run_backward"

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_SITE = os.path.dirname(_TORCH_DIR.rstrip(os.sep)) + os.sep
_OPSCAN_DIR = os.path.dirname(os.path.abspath(opscan.__file__)) + os.sep
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_KINDS: dict = {}  # id(code) -> (kind, unit or None, nested, code): a process's cache, filled once per function


def unit_of(qualname: str) -> str:
    """The unit a code object's qualname belongs to: up to its first ".<locals>"."""
    return qualname.split(".<locals>", 1)[0]


def _classify(code) -> tuple[int, str | None, bool]:
    """(kind, torch unit or None, whether the code is a nested function: a wrapper when it is outermost)."""
    path = os.path.abspath(code.co_filename)
    if path.startswith(_OPSCAN_DIR):
        return SKIP, None, False
    if not path.startswith(_TORCH_DIR):
        if path.startswith(_STDLIB) and "site-packages" not in path:
            return SKIP, None, False
        return OTHER, None, False
    rel = path[len(_SITE):].replace(os.sep, "/")
    qualname = getattr(code, "co_qualname", code.co_name)
    unit = f"{rel}:{unit_of(qualname)}"
    if unit == ENGINE_UNIT:
        return ENGINE, unit, False
    if rel.startswith(MACHINERY) or unit in MACHINERY_UNITS:
        return SKIP, None, False
    return TORCH, unit, "<locals>" in qualname


def where(frame) -> tuple[tuple[str, ...], tuple[str, int] | None]:
    """(the torch units on the stack above `frame`'s caller, innermost first; the first frame outside torch and
    opscan as (file, line), or None) — see the module docstring."""
    chain: list[str] = []
    entry = 0  # the chain's length at the outermost frame that is not a nested function
    caller = None
    while frame is not None:
        code = frame.f_code
        found = _KINDS.get(id(code))  # by identity: a code object's own hash reads its whole body
        if found is None or found[3] is not code:
            found = _KINDS[id(code)] = (*_classify(code), code)
        kind = found[0]
        if kind == TORCH:
            if not chain or chain[-1] != found[1]:
                chain.append(found[1])
            if not found[2]:
                entry = len(chain)
        elif kind == ENGINE:
            break
        elif kind == OTHER:
            caller = (code.co_filename, frame.f_lineno)
            break
        frame = frame.f_back
    return tuple(chain[:entry] if entry else chain), caller
