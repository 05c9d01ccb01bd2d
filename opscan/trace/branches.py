"""Trace stage: Python code that tests the device type, made to take the branch MPS takes.

docs/device_branches.md lists every device-type test in torch's Python code (torch 2.14.1 and 2.13.0) and in
transformers and timm, relevant or not and why (tools/audit_device_branches.py). The relevant ones that are
not the lens's aten composites are handled here: while a lens is active, each row's function is replaced in
its module by the version that answers as on MPS, and every call of it is recorded as a "steer" group (its
rule, condition and source reach the report's view summary). A row whose module is not imported (a
transformers model the step does not use) is left alone. The device lists of nn.MultiheadAttention's and
nn.TransformerEncoder(Layer)'s fast paths need no row: the trace's one TorchFunctionMode (functions.py) keeps
them off, as on MPS.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import textwrap
import types
from dataclasses import dataclass
from typing import Callable

import torch

from opscan.trace.questions import GRADSCALER

SRC_FOREACH = ("torch/utils/_foreach_utils.py _device_has_foreach_support: device.type in "
               "_get_foreach_kernels_supported_devices() + ['cpu'] (the kernels list: cuda, xpu, mtia, privateuse1; "
               "no mps), called by torch/nn/utils/clip_grad.py _get_total_norm, _clip_grads_with_norm_, "
               "clip_grad_value_ (torch 2.14.1 lines 92, 170, 288; docs/device_branches.md)")
SRC_INTERPOLATE = ("torch/nn/functional.py interpolate: `if not input.is_cpu and "
                   "torch.are_deterministic_algorithms_enabled()` -> torch._decomp.decompositions._upsample_linear_vec "
                   "(torch 2.14.1 lines 5267, 5287); the test was absent in 2.0, `input.is_cuda` in 2.1-2.4, "
                   "`input.is_cuda or input.is_xpu` in 2.5-2.8: MPS takes the branch from 2.9.0 on (the wheels' "
                   "torch/nn/functional.py; docs/device_branches.md)")
SRC_NORM = ("torch/functional.py norm: `input.layout == torch.strided and input.device.type in (\"cpu\", \"cuda\", "
            "\"meta\", <privateuse1>)` -> torch.linalg.vector_norm / matrix_norm; any other device (mps) -> _VF.norm "
            "(aten::norm.ScalarOpt_dim and the other norm overloads) or _VF.frobenius_norm, in every release 2.0-2.14 "
            "(torch 2.14.1 line 1844, 2.0.0 line 1489; Tensor.norm and F.normalize call torch.norm; "
            "docs/device_branches.md)")
SRC_FLOAT32 = ("transformers 5.24.0 {file}: `{text}` (MPS has no float64, so the function computes in float32 "
               "there; docs/device_branches.md)")
SRC_SCALER = ("torch/amp/grad_scaler.py GradScaler.unscale_: `self._scale.double().reciprocal().float() if "
              "self._scale.device != torch.device(\"mps:0\") else self._scale.reciprocal()` (2.8.0+, PR #150255; line "
              "per release in opscan/knowledge/autocast_mps.txt `gradscaler`); 2.3.0-2.7.1 always call "
              "self._scale.double(), which MPS refuses (no float64: TypeError, pytorch#142397)")
FLOAT32_SITES = (  # (module, function, file:line, the test) — transformers 5.24.0, the version the audit read
    ("transformers.models.aimv2.modeling_aimv2", "build_2d_sinusoidal_position_embedding",
     "models/aimv2/modeling_aimv2.py:147", 'torch.float64 if device is None or device.type != "mps"'),
    ("transformers.models.d_fine.modeling_d_fine", "build_2d_sinusoidal_position_embedding",
     "models/d_fine/modeling_d_fine.py:645", 'torch.float64 if device is None or device.type != "mps"'),
    ("transformers.models.deimv2.modeling_deimv2", "build_2d_sinusoidal_position_embedding",
     "models/deimv2/modeling_deimv2.py:717", 'torch.float64 if device is None or device.type != "mps"'),
    ("transformers.models.pp_doclayout_v2.modeling_pp_doclayout_v2", "build_2d_sinusoidal_position_embedding",
     "models/pp_doclayout_v2/modeling_pp_doclayout_v2.py:1531", 'torch.float64 if device is None or ... != "mps"'),
    ("transformers.models.pp_doclayout_v3.modeling_pp_doclayout_v3", "build_2d_sinusoidal_position_embedding",
     "models/pp_doclayout_v3/modeling_pp_doclayout_v3.py:808", 'torch.float64 if device is None or ... != "mps"'),
    ("transformers.models.pp_doclayout_v4.modeling_pp_doclayout_v4", "build_2d_sinusoidal_position_embedding",
     "models/pp_doclayout_v4/modeling_pp_doclayout_v4.py:753", 'torch.float64 if device is None or ... != "mps"'),
    ("transformers.models.rt_detr.modeling_rt_detr", "build_2d_sinusoidal_position_embedding",
     "models/rt_detr/modeling_rt_detr.py:860", 'torch.float64 if device is None or device.type != "mps"'),
    ("transformers.models.rt_detr_v2.modeling_rt_detr_v2", "build_2d_sinusoidal_position_embedding",
     "models/rt_detr_v2/modeling_rt_detr_v2.py:986", 'torch.float64 if device is None or device.type != "mps"'),
    ("transformers.models.udop.modeling_udop", "combine_image_text_embeddings",
     "models/udop/modeling_udop.py:201", 'torch.float32 if bbox.device.type == "mps" else torch.float64'),
    ("transformers.models.musicflamingo.modeling_musicflamingo", "apply_rotary_time_emb",
     "models/musicflamingo/modeling_musicflamingo.py:185",
     'torch.float32 if hidden_states.device.type == "mps" else torch.float64'),
)


@dataclass(frozen=True)
class PyBranch:
    """One Python-level device branch: the function replaced while a lens is active, and how."""

    rule: str
    module: str
    name: str  # an attribute of the module
    make: Callable[[Callable], Callable]  # the original -> the version that takes MPS's branch
    condition: str
    source: str
    import_it: bool = False  # import the module if needed (torch's own); else only when already imported
    applies: Callable = lambda args, kwargs: True  # does this call take another branch on MPS?
    question: tuple | None = None  # asked of the predicted-for release (questions.py) before the branch is taken
    when: object = True  # the answer for which the release takes the MPS branch (another: the traced code runs)
    since: tuple[int, int] | None = None  # the first release series whose code takes the branch on MPS (questions.py)


def _as_mps(original: Callable) -> Callable:
    """Ask a device helper about "mps" where it is asked about the traced device."""
    def helper(*args, **kwargs):
        args = tuple(_mps(a) for a in args)
        return original(*args, **{k: _mps(v) for k, v in kwargs.items()})
    return helper


def _mps(value):
    return torch.device("mps") if isinstance(value, torch.device) and value.type in ("cpu", "meta") else value


class _TracedMps:
    """`torch.device("mps:0")` as the replaced function sees it: equal to the traced device (cpu, meta)."""

    def __eq__(self, other):
        return isinstance(other, torch.device) and other.type in ("cpu", "meta")

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None


class _MpsTorch(types.ModuleType):
    """`torch` as the replaced function sees it: an "mps" device is the device the step is traced on."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        if name == "device":
            return lambda spec, *a: _TracedMps() if isinstance(spec, str) and spec.startswith("mps") \
                else torch.device(spec, *a)
        return getattr(torch, name)


def _mps_branch(original: Callable) -> Callable:
    """The function with its `device.type`-free MPS test (`x.device != torch.device("mps:0")`) answered as on MPS."""
    return _with_torch(original, _MpsTorch())


def _scaler_on(args, kwargs) -> bool:
    return bool(args) and getattr(args[0], "_enabled", False)


class _AsMps(ast.NodeTransformer):
    """`<x>.device.type` reads "mps"; `<x>.is_mps` True, `<x>.is_cpu` / `<x>.is_cuda` False."""

    def visit_Attribute(self, node):
        if node.attr == "type" and isinstance(node.value, ast.Attribute) and node.value.attr == "device":
            return ast.copy_location(ast.Constant("mps"), node)
        if node.attr in ("is_mps", "is_cpu", "is_cuda"):
            return ast.copy_location(ast.Constant(node.attr == "is_mps"), node)
        self.generic_visit(node)
        return node


@functools.lru_cache(maxsize=None)
def _device_as_mps(original: Callable) -> Callable:
    """The installed torch's own function, recompiled with its device tests answering as on MPS (its file and line
    numbers kept, so the trace names it as the function that issued its calls); the original when its source is
    not available. Made once per function and process (it reads its module's globals live, so the copy stays
    right): reading, parsing and compiling the source cost every trace milliseconds."""
    try:
        lines, first = inspect.getsourcelines(original)
    except (OSError, TypeError):
        return original
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    code = compile(_AsMps().visit(tree), inspect.getsourcefile(original) or "<mps>", "exec")
    body = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    copy = types.FunctionType(body, original.__globals__, original.__name__, original.__defaults__)
    copy.__kwdefaults__ = original.__kwdefaults__
    return copy


def _strided(args, kwargs) -> bool:
    x = args[0] if args else kwargs.get("input")
    return isinstance(x, torch.Tensor) and x.layout == torch.strided


def _deterministic_upsample(original: Callable) -> Callable:
    """upsample_{bi,tri}linear(input, output_size, align_corners, scale_factors), as F.interpolate calls it: on
    MPS under deterministic algorithms F.interpolate calls the decomposition with the same arguments instead."""
    def upsample(*args, **kwargs):
        from torch._decomp.decompositions import _upsample_linear_vec

        return _upsample_linear_vec(*args)
    return upsample


def _deterministic_vec(args, kwargs) -> bool:
    return torch.are_deterministic_algorithms_enabled() and len(args) == 4 and not kwargs


class _Float32Torch(types.ModuleType):
    """`torch` as the replaced function sees it: float64 reads as float32 (its only float64 use is the branch)."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return torch.float32 if name in ("float64", "double") else getattr(torch, name)


def _float32_branch(original: Callable) -> Callable:
    return _with_torch(original, _Float32Torch())


def _with_torch(original: Callable, proxy: types.ModuleType) -> Callable:
    names = dict(original.__globals__, torch=proxy)
    copy = types.FunctionType(original.__code__, names, original.__name__, original.__defaults__,
                              original.__closure__)
    copy.__kwdefaults__ = original.__kwdefaults__
    return copy


ROWS = (
    PyBranch("mps-no-foreach-clip", "torch.nn.utils.clip_grad", "_has_foreach_support", _as_mps,
             "clip_grad_norm_/clip_grad_value_ with foreach=None: MPS is not in the foreach list, so the per-tensor "
             "loop runs (the CPU trace takes _foreach_norm / _foreach_mul_)", SRC_FOREACH, import_it=True),
    PyBranch("mps-no-foreach-clip", "torch.nn.utils.clip_grad", "_device_has_foreach_support", _as_mps,
             "clip_grad_norm_/clip_grad_value_ with foreach=True: raises on MPS as the device has no foreach "
             "support", SRC_FOREACH, import_it=True),
    PyBranch("mps-interpolate-deterministic", "torch._C._nn", "upsample_bilinear2d", _deterministic_upsample,
             "F.interpolate bilinear under torch.use_deterministic_algorithms(True), torch 2.9+: MPS runs the "
             "decomposition", SRC_INTERPOLATE, import_it=True, applies=_deterministic_vec, since=(2, 9)),
    PyBranch("mps-interpolate-deterministic", "torch._C._nn", "upsample_trilinear3d", _deterministic_upsample,
             "F.interpolate trilinear under torch.use_deterministic_algorithms(True), torch 2.9+: MPS runs the "
             "decomposition", SRC_INTERPOLATE, import_it=True, applies=_deterministic_vec, since=(2, 9)),
    PyBranch("mps-gradscaler-unscale", "torch.amp.grad_scaler", "GradScaler.unscale_", _mps_branch,
             "GradScaler.unscale_ with the scale on MPS, in a release whose unscale_ has an MPS branch (2.8+): the "
             "inverse scale is a float32 reciprocal (the CPU trace takes the float64 one); 2.3.0-2.7.1 keep the "
             "float64 path, whose float64 rows MPS refuses", SRC_SCALER, import_it=True, applies=_scaler_on,
             question=(GRADSCALER, "unscale_"), when="mps-branch"),
    PyBranch("mps-norm", "torch.functional", "norm", _device_as_mps,
             "torch.norm, Tensor.norm, F.normalize on a strided tensor: MPS takes _VF.norm / _VF.frobenius_norm "
             "(aten::norm.ScalarOpt_dim, frobenius_norm.dim) where the CPU trace takes linalg_vector_norm",
             SRC_NORM, import_it=True, applies=_strided),
    PyBranch("mps-norm", "torch", "norm", _device_as_mps,
             "torch.norm, Tensor.norm, F.normalize on a strided tensor: MPS takes _VF.norm / _VF.frobenius_norm "
             "(aten::norm.ScalarOpt_dim, frobenius_norm.dim) where the CPU trace takes linalg_vector_norm",
             SRC_NORM, import_it=True, applies=_strided),
    *(PyBranch("mps-float32-branch", module, name, _float32_branch,
               f"{name} computes in float32 on MPS, float64 elsewhere",
               SRC_FLOAT32.format(file=where, text=text))
      for module, name, where, text in FLOAT32_SITES),
)


class Patched:
    """The ROWS' functions replaced (see the module docstring): while `enabled()`, each call of one that takes
    another branch on MPS runs the replacement, through `record(row, run)`."""

    def __init__(self, record: Callable, enabled: Callable[[], bool], ask: Callable | None = None,
                 release_at_least: Callable[[tuple[int, int]], bool] = lambda version: True):
        self.record, self.enabled, self.ask = record, enabled, ask or (lambda question: None)
        self.release_at_least = release_at_least
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> Patched:
        for row in ROWS:
            owner, name = _owner(row)
            original = getattr(owner, name, None) if owner is not None else None
            if original is None:
                continue
            self._saved.append((owner, name, original))
            setattr(owner, name, self._wrapped(row, original, row.make(original)))
        return self

    def __exit__(self, *exc) -> None:
        while self._saved:
            module, name, original = self._saved.pop()
            setattr(module, name, original)

    def _wrapped(self, row: PyBranch, original: Callable, replacement: Callable) -> Callable:
        def call(*args, **kwargs):
            if not self.enabled() or not row.applies(args, kwargs) or (
                    row.since is not None and not self.release_at_least(row.since)):
                return original(*args, **kwargs)
            if row.question is not None and self.ask(row.question) != row.when:
                return original(*args, **kwargs)  # the predicted-for release runs the traced code there too
            return self.record(row, lambda: replacement(*args, **kwargs))
        return call


def _module(row: PyBranch):
    if row.module in sys.modules:
        return sys.modules[row.module]
    return importlib.import_module(row.module) if row.import_it else None


def _owner(row: PyBranch):
    """(the object holding the replaced attribute — the module, or a class of it for "Class.method" —, its name)."""
    owner = _module(row)
    *path, name = row.name.split(".")
    for part in path:
        owner = getattr(owner, part, None) if owner is not None else None
    return owner, name
