"""Target stage: a target file's code runs once per process, as `import` runs a module's code once.

Running a file's code a second time defines its custom ops a second time, and torch does not survive that:
`torch.library.custom_op("ns::name")` for a name already defined destroys the first definition's Library
(torch/_library/custom_ops.py get_library_allowing_overwrite), the dispatcher frees that operator's entry, and
the first definition (the function object the first run's module holds, which the models it built call) keeps
a raw handle to the freed memory. Calling it afterwards reads freed memory: it runs the new definition's
kernels when the new entry happened to be allocated at the same address (usually, so nothing shows), and
otherwise another operator, a `MemoryError: std::bad_alloc`, or a crash. A second `Library("ns", "DEF")` fails
at once. `opscan accept` builds the target twice, `--memory --device` builds it again, and a Python caller may
have imported the file before scanning it (opscan.scan in a notebook): each would break the target's own ops.

`loaded_module` finds the module this process last made from a file — opscan's earlier load, or the caller's
own `import` — so that load.py uses it again instead of running the file anew; a file that failed to import is
not in sys.modules (load.py removes it), so it runs again. `redefined` names the custom ops that a load which
did run a file defined anew (another file defining the same op, a module still being imported): the objects
made before from them are the broken ones, and the load warns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType


def loaded_module(path: Path) -> ModuleType | None:
    """The module this process imported from the file `path` last (sys.modules keeps the order modules were
    added in), or None. `__main__` and a module whose code is still running are never reused."""
    resolved = path.resolve()
    found = None
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if (name != "__main__" and isinstance(file, str) and os.path.basename(file) == resolved.name
                and not getattr(getattr(module, "__spec__", None), "_initializing", False)
                and _resolves_to(file, resolved)):
            found = module
    return found


def _resolves_to(file: str, resolved: Path) -> bool:
    try:
        return Path(file).resolve() == resolved
    except (OSError, RuntimeError, ValueError):
        return False


def custom_op_libraries() -> dict:
    """Qualified name -> the Library that holds the current `torch.library.custom_op` definition of each custom op
    of this process ({} on a torch without custom_op)."""
    try:
        from torch._library import custom_ops
    except ImportError:
        return {}
    return dict(getattr(custom_ops, "OPDEF_TO_LIB", {}))


def redefined(before: dict) -> list[str]:
    """The custom ops defined in `before` (custom_op_libraries() earlier) whose definition has been replaced since."""
    now = custom_op_libraries()
    return sorted(name for name, library in now.items() if name in before and before[name] is not library)


def redefined_warning(path: Path, names: list[str]) -> str:
    """The warning for a load that defined custom ops anew."""
    ops = ", ".join(names)
    return (f"importing {path} defined custom op(s) {ops} again: they were already defined in this process, and "
            "torch frees the earlier definition — calling it through objects made before (the module that first "
            "defined it, a model built from it) may run the new one, fail with std::bad_alloc or crash; define each "
            "custom op in one file, imported once per process")
