"""Target stage: turn "file.py:fn" or "pkg.mod:fn" into a model, example inputs and step hooks.

The contract (docs/targets.md): the factory returns an `nn.Module` or `(model, example_inputs)`.
Otherwise the file may define `example_inputs()`, or the user passes `--input SHAPE:DTYPE`.
Optional hooks in the same file: `train_step(model, optimizer, inputs)`, `loss_fn(outputs, inputs)`,
`build_optimizer(model)`, `device_tensors(model, inputs)` (the tensors the user's own code has on the device when the
step runs, moved in a way the trace cannot see: the placement model, docs/trace.md). Every failure here is a
`TargetError` with one actionable line.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from opscan.errors import TargetError
from opscan.units import human_bytes
from opscan.target.inputs import InputSpec, random_inputs
from opscan.target.once import custom_op_libraries, loaded_module, redefined, redefined_warning
from opscan.target.run import RunContext
from opscan.target.seeds import seed_generators
from opscan.target.user_code import anchor_of, own_file, project_folder

log = logging.getLogger("opscan")

_OPSCAN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep


@dataclass(frozen=True)
class Target:
    """A loaded model with everything needed to run its step."""

    spec: str
    name: str
    model: torch.nn.Module
    inputs: Any
    train_step: Callable | None
    loss_fn: Callable | None
    build_optimizer: Callable | None
    fake: Any = None  # trace.fake.FakeBuild: the FakeTensorMode model and inputs were built in, or None
    # the factory as (file, line of its def, qualname) when it is the user's own code: the `where` of a call no line
    # of the user's code made (opscan's default step running a library model, trace/frames.py)
    anchor: tuple[str, int, str] | None = None
    project: str | None = None  # the user's project folder: `where` paths are relative to it (target/user_code.py)
    # the tensors (nested in lists, tuples, dicts) the user's own code has on the device when the step runs, though
    # the step does not move them itself (trace/tensors.py StoragePlaces: they are given, as parameters are)
    device_tensors: Callable | None = None
    # trace/device_calls.DeviceCall: the code that picked a device while the target was built (import, factory,
    # example inputs), when it was built as a Mac runs it (scan.prepare)
    device_calls: tuple = ()


def split_spec(spec: str) -> tuple[str, str]:
    """"path/model.py:fn" or "pkg.mod:fn" -> (location, function name)."""
    location, sep, func = spec.rpartition(":")
    if not sep or not location or not func.isidentifier():
        raise TargetError(
            f"target {spec!r} is not of the form FILE.py:FUNCTION or package.module:FUNCTION "
            "— e.g. examples/cnn.py:build_model or torchvision.models:resnet18"
        )
    return location, func


def import_location(location: str, ctx: RunContext) -> ModuleType:
    """Import a .py file (by path) or a dotted module name, turning failures into TargetError."""
    if location.endswith(".py") or "/" in location or Path(location).is_file():
        return _import_file(Path(location), ctx)
    try:
        with ctx.running(f"importing {location}"):
            return importlib.import_module(location)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise TargetError(
            f"cannot import module {location!r}: {type(exc).__name__}: {exc} "
            "— install it, or point TARGET at a file with FILE.py:FUNCTION",
            user_traceback=_user_traceback(),
        ) from None


def _import_file(path: Path, ctx: RunContext) -> ModuleType:
    path = ctx.absolute(path)  # against where the command started: the target may have changed directory
    if not path.is_file():
        raise TargetError(f"model file {str(path)!r} does not exist — check the path in TARGET")
    folder = os.path.abspath(path.parent)  # as named, links kept: code imported from it lies in the user's project
    module = loaded_module(path)  # imported here before (by opscan or the caller): its code runs once (once.py)
    if module is None:
        name = f"opscan_target_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise TargetError(f"cannot load {str(path)!r} as Python — TARGET files must be .py files")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            _run_file(path, folder, spec, module, ctx)
        except BaseException:
            sys.modules.pop(name, None)  # as `import` does: a file that failed runs again next time, not half-made
            raise
    elif folder not in sys.path:
        sys.path.insert(0, folder)
    return module


def _run_file(path: Path, folder: str, spec, module: ModuleType, ctx: RunContext) -> None:
    """Run the file's code into `module`, with its folder first on sys.path; warn when it defined custom ops that
    this process had defined already (once.py)."""
    sys.path.insert(0, folder)
    defined = custom_op_libraries()
    try:
        with ctx.running(f"importing {path}"):
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise TargetError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg} — fix the file and rerun",
            user_traceback=_user_traceback(),
        ) from None
    except Exception as exc:  # noqa: BLE001
        raise TargetError(
            f"importing {path} raised {type(exc).__name__}: {exc} — fix the file or install what it imports",
            user_traceback=_user_traceback(),
        ) from None
    finally:
        again = redefined(defined)
        if again:
            log.warning("%s", redefined_warning(path, again))


def load_target(spec: str, factory_args: dict[str, Any], input_specs: list[InputSpec],
                choose_fake: Callable | None = None, ctx: RunContext | None = None) -> Target:
    """Load TARGET, call its factory and find its inputs and optional step hooks.

    `choose_fake(factory, factory_args, input_bytes)` (trace/fake.py) may return a FakeBuild: the factory and
    the inputs then run inside its FakeTensorMode (a built module can't be moved into it later). `ctx`: the
    run's context (its stages of user code; a fresh one when None)."""
    ctx = ctx or RunContext()
    location, func_name = split_spec(spec)
    module = import_location(location, ctx)
    factory = getattr(module, func_name, None)
    if factory is None:
        raise TargetError(
            f"{location} has no function {func_name!r} — name a function that returns an nn.Module"
        )
    if not callable(factory):
        raise TargetError(
            f"{func_name!r} in {location} is not a function (it is of type {type(factory).__name__}) "
            "— name a function that returns an nn.Module"
        )
    fake = None
    if choose_fake is not None:
        with ctx.running(f"calling {func_name}() on the meta device (sizing the model)"):
            fake = choose_fake(factory, factory_args, input_bytes(input_specs))
    with fake.mode if fake is not None else contextlib.nullcontext():
        seed_generators()  # random weights (and what a step's shapes follow from them) the same run to run
        with ctx.running(f"calling {func_name}()"):
            model, inputs = _call_factory(factory, spec, factory_args)
        if input_specs:
            inputs = _random_inputs(input_specs, fake is not None)
        elif inputs is None:
            with ctx.running("calling example_inputs()"):
                inputs = _example_inputs(module, model, spec)
    return Target(
        spec=spec,
        name=_model_name(func_name, model),
        model=model,
        inputs=inputs,
        train_step=_hook(module, "train_step"),
        loss_fn=_hook(module, "loss_fn"),
        build_optimizer=_hook(module, "build_optimizer"),
        fake=fake,
        device_tensors=_hook(module, "device_tensors"),
        anchor=anchor_of(factory),
        project=_project(module),
    )


def _call_factory(factory: Callable, spec: str, factory_args: dict[str, Any]):
    try:
        result = factory(**factory_args)
    except TypeError as exc:
        if factory_args and "argument" in str(exc):
            raise TargetError(f"{spec} does not accept these --arg values: {exc}") from None
        raise _factory_failed(spec, exc) from None
    except Exception as exc:  # noqa: BLE001
        raise _factory_failed(spec, exc) from None
    inputs = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        result, inputs = result
    if not isinstance(result, torch.nn.Module):
        raise TargetError(
            f"{spec} returned {type(result).__name__}, not an nn.Module — return the model, "
            "or a (model, example_inputs) pair"
        )
    return result, inputs


def input_bytes(specs: list[InputSpec]) -> int:
    """Bytes the --input tensors take."""
    return sum(math.prod(spec.shape) * getattr(torch, spec.dtype).itemsize for spec in specs)


def _random_inputs(specs: list[InputSpec], fake: bool):
    """The --input tensors; one that cannot be allocated is a TargetError naming its size."""
    try:
        return random_inputs(specs)
    except (RuntimeError, MemoryError) as exc:
        size = human_bytes(input_bytes(specs))
        raise TargetError(f"the --input tensors ({size}) cannot be allocated{' as fake tensors' * fake}: "
                          f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]} — pass smaller "
                          "--input shapes, or --fake to trace without allocating") from None


def _factory_failed(spec: str, exc: Exception) -> TargetError:
    return TargetError(
        f"{spec} raised {type(exc).__name__}: {exc} — fix the factory (rerun with -v for its traceback)",
        user_traceback=_user_traceback(),
    )


def _example_inputs(module: ModuleType, model: torch.nn.Module, spec: str):
    maker = getattr(module, "example_inputs", None)
    if maker is None:
        raise TargetError(
            f"{spec} gives no example inputs — return (model, inputs) from the factory, define "
            "example_inputs() in the file, or pass --input SHAPE:DTYPE (e.g. --input 1x3x224x224:float32)"
        )
    try:
        takes_model = len(inspect.signature(maker).parameters) > 0
        return maker(model) if takes_model else maker()
    except Exception as exc:  # noqa: BLE001
        raise TargetError(
            f"example_inputs() raised {type(exc).__name__}: {exc} — fix it or pass --input",
            user_traceback=_user_traceback(),
        ) from None


def _user_traceback() -> str:
    """The exception being handled, without opscan's and importlib's frames (the user's code only)."""
    exc = sys.exc_info()[1]
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith((_OPSCAN_DIR, _IMPORTLIB_DIR, "<frozen importlib"))]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "Traceback (opscan frames removed):\n" + "".join(lines)


def _project(module: ModuleType) -> str | None:
    """The project folder of the target's file (a module target's, when it is the user's own code)."""
    path = getattr(module, "__file__", None)
    return project_folder(os.path.abspath(path)) if path and own_file(os.path.abspath(path)) else None


def _hook(module: ModuleType, name: str) -> Callable | None:
    value = getattr(module, name, None)
    return value if callable(value) else None


def _model_name(func_name: str, model: torch.nn.Module) -> str:
    generic = {"build_model", "build", "model", "make_model", "create_model", "get_model"}
    return type(model).__name__ if func_name in generic else func_name
