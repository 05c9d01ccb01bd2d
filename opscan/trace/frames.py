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
  (transformers, timm, torchvision) that called torch;
- the walk goes on from there (and past the autograd engine: a backward call's `backward()` line) to the innermost
  frame of the user's own code (target/user_code.py own_file: not opscan, torch, the standard library, an
  installed library or generated code): the call's `user` (file, line, qualname); the innermost frame of an
  installed library passed on the way is its `via` (the library's own line that called torch). It stops at the
  frame that runs the step (trace/step.py's runners, `STEP_RUNNERS`): what called opscan (the CLI, pytest, a
  notebook calling `opscan.analyze`) is no part of the step. A call of opscan's default step has no `user`.

Each code object is classified once (`_KINDS`, keyed by identity), so a call costs one dictionary lookup per frame
passed; a call from the user's own code (a model's `forward`) stops at its caller.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import replace

import torch
from torch._C._autograd import _get_sequence_nr as _sequence_nr

import opscan
from opscan.target.user_code import installed_part, notebook_cell, own_file
from opscan.trace.step import run_inference, run_train_step
from opscan.trace.records import CallSite

SKIP, TORCH, ENGINE, LIBRARY, USER, RUNNER = 0, 1, 2, 3, 4, 5  # LIBRARY and USER: outside torch and opscan
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
_KINDS: dict = {}  # id(code) -> (kind, unit or place, nested, code): a process's cache, filled once per function
STEP_RUNNERS = frozenset({run_train_step.__code__, run_inference.__code__})


def unit_of(qualname: str) -> str:
    """The unit a code object's qualname belongs to: up to its first ".<locals>"."""
    return qualname.split(".<locals>", 1)[0]


def _classify(code, frame) -> tuple[int, str | tuple[str, str] | None, bool]:
    """(kind, torch unit or (file, qualname) of a frame outside torch or None, whether the code is a nested
    function: a wrapper when it is outermost). A library's file is its path inside site-packages, the user's
    absolute."""
    if code in STEP_RUNNERS:
        return RUNNER, None, False
    if notebook_cell(code.co_filename) is not None:  # a notebook's cell, under the name IPython compiled it as
        return USER, (code.co_filename, getattr(code, "co_qualname", code.co_name)), False
    path = os.path.abspath(code.co_filename)
    if path.startswith(_OPSCAN_DIR):
        return SKIP, None, False
    if not path.startswith(_TORCH_DIR):
        if path.startswith(_STDLIB) and "site-packages" not in path:
            return SKIP, None, False
        qualname = getattr(code, "co_qualname", code.co_name)
        generated = _generated_by_library(frame, path)
        if generated is not None:
            return LIBRARY, (generated, qualname), False
        if own_file(path):
            return USER, (path, qualname), False
        return LIBRARY, (installed_part(path) or code.co_filename, qualname), False
    rel = path[len(_SITE):].replace(os.sep, "/")
    qualname = getattr(code, "co_qualname", code.co_name)
    unit = f"{rel}:{unit_of(qualname)}"
    if unit == ENGINE_UNIT:
        return ENGINE, unit, False
    if rel.startswith(MACHINERY) or unit in MACHINERY_UNITS:
        return SKIP, None, False
    return TORCH, unit, "<locals>" in qualname


def _generated_by_library(frame, path: str) -> str | None:
    """A stable name for code an installed library generated and imported from a file of its own making
    (torch_geometric's message-passing templates, written to a fresh temporary file per process): the module's
    dotted name as a path inside the library, marked generated; None for any other code. A file outside
    site-packages whose module belongs to an installed package is that package's code, not the user's, and its
    temporary file name would make every report differ from the last."""
    if installed_part(path) is not None:
        return None
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str) or "." not in name:
        return None
    top = name.split(".", 1)[0]
    package = sys.modules.get(top)
    origin = getattr(package, "__file__", None) if package is not None else _origin(top)
    if not isinstance(origin, str) or installed_part(origin) is None:
        return None
    return name.replace(".", "/") + ".py (generated)"


def _origin(top: str) -> str | None:
    """The file a top-level package would be imported from (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def where(frame) -> tuple[tuple[str, ...], tuple[str, int] | None, tuple | None, tuple | None]:
    """(the torch units on the stack above `frame`'s caller, innermost first; the first frame outside torch and
    opscan as (file, line), or None; the user's frame and the library's `via` as (file, line, qualname), or None)
    — see the module docstring."""
    chain: list[str] = []
    entry = 0  # the chain's length at the outermost frame that is not a nested function
    caller = None
    kinds = _KINDS
    while frame is not None:
        code = frame.f_code
        found = kinds.get(id(code))  # by identity: a code object's own hash reads its whole body
        if found is None or found[3] is not code:
            found = _KINDS[id(code)] = (*_classify(code, frame), code)
        kind = found[0]
        if kind == SKIP:  # (most frames: opscan's, torch's dispatch and call plumbing)
            frame = frame.f_back
            continue
        if kind == TORCH:
            if not chain or chain[-1] != found[1]:
                chain.append(found[1])
            if not found[2]:
                entry = len(chain)
        elif kind == ENGINE or kind == RUNNER:
            break
        elif kind == USER:  # the user's own code called torch: nothing further to find
            line = frame.f_lineno
            return (tuple(chain[:entry] if entry else chain), (code.co_filename, line),
                    (found[1][0], line, found[1][1]), None)
        elif kind == LIBRARY:
            caller = (code.co_filename, frame.f_lineno)
            break
        frame = frame.f_back
    user, via = _user(frame)
    return tuple(chain[:entry] if entry else chain), caller, user, via


def _user(frame) -> tuple[tuple | None, tuple | None]:
    """(the innermost frame of the user's own code from `frame` outward, the innermost library frame before it),
    each as (file, line, qualname); the walk ends at the step's runner."""
    via = None
    kinds = _KINDS
    while frame is not None:
        code = frame.f_code
        found = kinds.get(id(code))
        if found is None or found[3] is not code:
            found = _KINDS[id(code)] = (*_classify(code, frame), code)
        kind = found[0]
        if kind == SKIP or kind == TORCH:
            frame = frame.f_back
            continue
        if kind == USER:
            return (found[1][0], frame.f_lineno, found[1][1]), via
        if kind == RUNNER:
            break
        if kind == LIBRARY and via is None:
            via = (found[1][0], frame.f_lineno, found[1][1])
        frame = frame.f_back
    return None, via


class Sites:
    """The calling places of one trace: each distinct (py chain, caller, user frame, via) interned once as
    (chain, caller, CallSite), and the CallSite of the forward call that created each autograd node, for the backward
    calls that node runs. `anchor`: the target's factory (target/load.py), the CallSite of a call no frame of the
    user's code made."""

    def __init__(self, anchor: tuple[str, int, str] | None = None):
        self.anchor = anchor
        self._sites: dict[tuple, tuple] = {}
        self._nodes: dict[int, CallSite | None] = {}  # autograd sequence number -> the site of the call that made it
        self._as_node: dict[int, tuple] = {}  # id(CallSite) -> (CallSite, the same as a backward call's)
        self._seq = _sequence_nr()  # the next autograd node's sequence number

    def of(self, frame) -> tuple:
        """(py chain, caller, CallSite or None) of a call received by `frame`'s callee."""
        key = where(frame)
        found = self._sites.get(key)
        if found is None:
            found = self._sites[key] = (key[0], key[1], self._where(key[2], key[3]))
        return found

    def _where(self, user, via) -> CallSite | None:
        if user is not None:
            return CallSite(*user, via=via)
        if self.anchor is not None:
            return CallSite(*self.anchor, via=via, by="factory")
        return CallSite(None, None, None, via=via) if via is not None else None

    def where(self, phase: str, found: CallSite | None, node=None) -> CallSite | None:
        """The CallSite of a call in `phase` whose walk found `found`: a backward call's is its node's forward call's
        when known; the autograd nodes a forward call created (sequence numbers handed out since the last call:
        autograd makes the node before the call reaches the dispatch mode) take its own. `node`: the autograd node
        running a backward call (the caller's read of torch._C._current_autograd_node())."""
        if phase == "backward":
            made = self._nodes.get(node._sequence_nr()) if node is not None else None
            return found if made is None else made
        seq = _sequence_nr()
        if seq != self._seq:
            made = self._node_form(found)
            for nr in range(self._seq, seq):
                self._nodes[nr] = made
            self._seq = seq
        return found

    def _node_form(self, found: CallSite | None) -> CallSite | None:
        if found is None or found.by != "call":
            return found
        pair = self._as_node.get(id(found))
        if pair is None or pair[0] is not found:
            pair = self._as_node[id(found)] = (found, replace(found, by="node"))
        return pair[1]
