"""A target file's code runs once per process (opscan/target/once.py): loading a file that this process imported
already — the caller's own `import`, or opscan's earlier load (`opscan accept` builds the target twice,
`--memory --device` builds it again) — uses that module instead of running the file again. Running it again
would define its custom ops again: torch frees the first `custom_op` definition, and the objects made from it
(the module the caller imported, the models built before) call freed memory — tests/test_api.py failed about one
run in three with `MemoryError: std::bad_alloc` in examples/tricky.py's `scale(out, 0.5)` so. A load that does
define a custom op anew (another file defining the same op) warns."""

from __future__ import annotations

import gc
import importlib.util
import logging
import sys
import uuid

import pytest
import torch
from torch._library import custom_ops

from opscan.accept.engine import AcceptOptions, accept
from opscan.errors import TargetError
from opscan.target.load import load_target

CUSTOM_OP = '''
import torch

@torch.library.custom_op("{ns}::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor

@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)

def build_model():
    return torch.nn.Linear(3, 2), torch.ones(1, 3)
'''

LIBRARY_DEF = '''
import torch
from torch import nn

lib = torch.library.Library("{ns}", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")

class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        return torch.ops.{ns}.twice(self.linear(x))

def build_model():
    torch.manual_seed(0)
    return Twice(), torch.randn(4, 3)
'''


def _namespace() -> str:
    return f"once_{uuid.uuid4().hex[:8]}"  # custom ops live for the whole process: one namespace per test


def _import(path, name: str):
    """`import name` of the file at `path`, as a caller who imported their model file does."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def user_module(tmp_path):
    """A model file with a torch.library.custom_op, imported by the caller (removed from sys.modules after)."""
    ns = _namespace()
    path = tmp_path / "user_model.py"
    path.write_text(CUSTOM_OP.format(ns=ns), encoding="utf-8")
    name = f"user_model_{ns}"
    yield _import(path, name), path, f"{ns}::scale"
    sys.modules.pop(name, None)


def test_loading_a_file_the_caller_imported_keeps_the_callers_custom_op_alive(user_module, caplog):
    module, path, qualname = user_module
    with caplog.at_level(logging.WARNING, logger="opscan"):
        target = load_target(f"{path}:build_model", {}, [])
    gc.collect()  # whatever a second definition would have dropped is gone now
    assert target.train_step is None and target.model.__class__ is torch.nn.Linear
    assert custom_ops.OPDEFS[qualname] is module.scale  # the caller's definition is still the registered one ...
    assert module.scale._lib.m is not None  # ... and its Library was not destroyed under it
    assert torch.equal(module.scale(torch.ones(3), 0.5), torch.full((3,), 0.5))
    assert [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(path)] == [module]
    assert not caplog.records


def test_the_file_runs_once_however_often_it_is_loaded_and_builds_fresh_models(tmp_path):
    ns = _namespace()
    path = tmp_path / "library_def.py"
    path.write_text(LIBRARY_DEF.format(ns=ns), encoding="utf-8")
    first, second = load_target(f"{path}:build_model", {}, []), load_target(f"{path}:build_model", {}, [])
    assert first.model is not second.model  # the factory runs per load: accept's target and its fresh copy
    assert type(first.model) is type(second.model)  # one module: the file ran once (a second DEF would raise)
    assert torch.equal(first.model(first.inputs), 2 * first.model.linear(first.inputs))


def test_accept_on_a_target_that_defines_its_ops_builds_it_twice_without_running_the_file_twice(tmp_path):
    path = tmp_path / "accept_def.py"
    path.write_text(LIBRARY_DEF.format(ns=_namespace()), encoding="utf-8")
    result = accept(AcceptOptions(f"{path}:build_model", device="cpu", reference="cpu"))
    assert result.failures == () and result.exit_code == 0, result.failures  # before: TargetError, a second DEF
    assert {"output", "gradient"} <= {c.kind for c in result.comparisons}


def test_a_file_that_failed_to_import_is_run_again_once_fixed(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise ValueError('not yet')\n", encoding="utf-8")
    with pytest.raises(TargetError, match="raised ValueError: not yet"):
        load_target(f"{path}:build_model", {}, [])
    path.write_text("import torch\n\ndef build_model():\n    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n",
                    encoding="utf-8")
    assert load_target(f"{path}:build_model", {}, []).model.out_features == 2


def test_a_second_file_defining_the_same_custom_op_is_loaded_with_a_warning(user_module, tmp_path, caplog):
    module, _, qualname = user_module
    other = tmp_path / "copy_of_the_model.py"
    other.write_text(CUSTOM_OP.format(ns=qualname.split("::")[0]), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="opscan"):
        load_target(f"{other}:build_model", {}, [])
    [record] = caplog.records
    assert f"importing {other} defined custom op(s) {qualname} again" in record.getMessage()
    assert "may run the new one, fail with std::bad_alloc or crash" in record.getMessage()
    assert custom_ops.OPDEFS[qualname] is not module.scale  # torch's doing: the caller's definition was replaced
