"""Trace stage: mixed precision as a Mac runs the step — which autocast regions are MPS autocast, under which
release's policy, and what a GradScaler does there.

How a `torch.autocast(device_type, dtype)` region of the step is read (while `AmpTrace` is entered):
- `"mps"`, or the device the step is traced on (`"cpu"`; `"meta"` in a sizing run) given by an expression — the
  portable `torch.autocast(device_type=x.device.type, ...)`, which names "mps" on a Mac: MPS autocast. The
  predicted-for release is asked what `torch.autocast("mps", dtype)` does there (questions.py; the table
  opscan/knowledge/autocast_mps.txt): enabled with that dtype (default float16) -> the region runs CPU autocast
  with MPS's dtype and the release's AutocastMPS per-op policy (amp_kernels.py); disabled (2.5 with bfloat16,
  bfloat16 below macOS 14 in 2.6-2.9, a dtype MPS autocast does not take) -> traced without autocast, with a note;
  raises (before 2.5: no MPS autocast) -> a `torch::autocast.mps` call is recorded (an error row for that
  release) and the region is traced without autocast.
- `"cpu"` written as a literal string (read from the call's source), or `torch.cpu.amp.autocast`: on a Mac this
  autocasts CPU tensors only and the step's tensors are on mps, so the region is traced without autocast, with a
  note saying to write `device_type=x.device.type`. A call whose source cannot be read is read as portable.
- any other device (`"cuda"`, `torch.cuda.amp.autocast`): a Mac has none, autocast does nothing there: traced
  without autocast, with a note saying what to write instead.
GradScaler: an enabled `torch.amp.GradScaler` in a release that has none (before 2.3) records a
`torch::amp.GradScaler` call (an error row); its `unscale_` on an MPS scale is a device branch of branches.py.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import sys

import torch

from opscan.opkey import OpKey
from opscan.trace.amp_kernels import KEY, TRACED_DEVICES, low_precision, register, to_float32
from opscan.trace.questions import Questions

AUTOCAST_OP = OpKey("torch", "autocast", "mps")
SCALER_OP = OpKey("torch", "amp", "GradScaler")
PORTABLE = "torch.autocast(device_type=x.device.type, dtype=...)"


class AmpTrace:
    """The reading of the module docstring, while entered. `release` answers the questions; `notes` collects the
    trace's notes; `recorder` (recorder.py; None in a sizing run) records the findings and is muted while a refused
    call is run again in float32; `meta`: the step runs on meta tensors."""

    def __init__(self, release: Questions, notes: list, recorder=None, meta: bool = False, devices=None):
        self.release, self.notes, self.recorder, self.meta = release, notes, recorder, meta
        self.devices = devices  # device_calls.DeviceCalls: an autocast region made for "cuda" is recorded there
        self.muted = recorder.muted if recorder is not None else contextlib.nullcontext
        self.cache: dict = {}  # autocast's weight cache: id -> (tensor, its cast), cleared on leaving the regions
        self._depth = 0
        self._library = None
        self._stack = contextlib.ExitStack()
        self._scalers: set[int] = set()

    def __enter__(self) -> AmpTrace:
        from torch.amp import grad_scaler
        from torch.amp.autocast_mode import autocast

        for owner, name, make in ((autocast, "__init__", self._init), (autocast, "__enter__", self._enter),
                                  (autocast, "__exit__", self._exit), (grad_scaler.GradScaler, "scale", self._scale)):
            original = owner.__dict__[name]
            setattr(owner, name, make(original))
            self._stack.callback(setattr, owner, name, original)
        if self.meta:  # meta tensors have no autocast key: let CPU autocast's reach them (it acts only when on)
            self._stack.enter_context(torch._C._IncludeDispatchKeyGuard(KEY))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        if self._library is not None:
            self._library._destroy()
            self._library = None

    # the kernels' side (amp_kernels.py)
    def cast_of(self, op: str) -> str | None:
        """The predicted-for release's AutocastMPS policy for `op` (asked)."""
        return self.release.autocast_cast(op)

    def guarded(self, op, run, args, kwargs):
        """run(); when the CPU refuses the call's float16/bfloat16 inputs, the call (recorded as raised) is run
        again in float32 with the recorder muted, so the step goes on."""
        start = len(self.recorder.calls) if self.recorder is not None else 0
        try:
            return run()
        except RuntimeError as exc:
            if not low_precision(args, kwargs):
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            if self.recorder is not None and not any(c is not None and c.raised for c in self.recorder.calls[start:]):
                self.recorder.note_call(OpKey.of(op), f"{type(exc).__name__}: {first}", args, kwargs)
            self._note(f"{OpKey.of(op)} refused its float16/bfloat16 input on the tracing CPU ({type(exc).__name__}: "
                       f"{first}): the call stays in the trace for MPS to be judged on, and the step went on with its "
                       "result computed in float32")
            with self.muted(), torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(KEY)):
                up_args, up_kwargs = to_float32(args, kwargs)
                return op(*up_args, **up_kwargs)

    # torch.autocast
    def _init(self, original):
        def __init__(region, device_type, dtype=None, enabled=True, cache_enabled=None):
            literal, where = _call_site(sys._getframe(1), region)
            if self.devices is not None and str(device_type) == "cuda":
                self.devices.saw("device-autocast-cuda", _autocast_spelling(region), sys._getframe(1))
            device, dtype, enabled = self._read(str(device_type), dtype, enabled, literal, where)
            original(region, device, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
            region._opscan_read = True
        return __init__

    def _enter(self, original):
        def __enter__(region):
            if not getattr(region, "_opscan_read", False):  # made before the trace (a decorator): read it now
                region._opscan_saved = (region.device, region.fast_dtype, region._enabled)
                given = region.fast_dtype if region.device == "mps" else None
                device, dtype, enabled = self._read(region.device, given, region._enabled, None, "a decorator")
                region.device, region.fast_dtype, region._enabled = device, dtype or region.fast_dtype, enabled
            self._depth += 1
            return original(region)
        return __enter__

    def _exit(self, original):
        def __exit__(region, *exc):
            try:
                return original(region, *exc)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.cache.clear()
                saved = region.__dict__.pop("_opscan_saved", None)
                if saved is not None:
                    region.device, region.fast_dtype, region._enabled = saved
        return __exit__

    def _read(self, device: str, dtype, enabled: bool, literal, where: str):
        """(device, dtype, enabled) to run the region with (see the module docstring)."""
        if device == "mps" or (device in TRACED_DEVICES and literal is not True):
            return self._mps(device, dtype, enabled, literal, where)
        if device == "cpu":
            self._note(f"torch.autocast('cpu') at {where}: traced without autocast — on a Mac it autocasts CPU "
                       f"tensors only, and the step's tensors are on mps; write {PORTABLE} to autocast on MPS")
        else:
            self._note(f"torch.autocast({device!r}) at {where}: traced without autocast — a Mac has no {device}, so "
                       f"the region runs without autocast there; write {PORTABLE} (or 'mps') to autocast on MPS")
        return "cpu", None, False

    def _mps(self, device: str, dtype, enabled: bool, literal, where: str):
        name = str(dtype).removeprefix("torch.") if dtype is not None else None
        kind, _, rest = self.release.autocast_gate(name).partition(" ")
        spelled = f"torch.autocast({device!r}{'' if name is None else ', dtype=' + name}) at {where}"
        if device != "mps":
            spelled += " (read as autocast on the step's device: mps on a Mac" + \
                       ("; the call's source could not be read)" if literal is None else ")")
        if kind == "raises":
            if self.recorder is not None:
                self.recorder.note_call(AUTOCAST_OP, rest)
            self._note(f"{spelled}: raises on a Mac in the predicted-for release ({rest}); row {AUTOCAST_OP}, and "
                       "the region was traced without autocast")
            return "cpu", None, False
        if kind != "enabled":
            self._note(f"{spelled}: on a Mac the predicted-for release {rest}: traced without autocast")
            return "cpu", None, False
        if enabled:
            self._activate()
            self._note(f"{spelled}: traced as MPS autocast in {rest}, each op cast by the predicted-for release's "
                       "AutocastMPS policy (opscan/knowledge/autocast_mps.txt, read from the macOS wheels by "
                       "tools/build_autocast_mps.py); ops it does not list run on the dtypes they get")
        return "cpu", getattr(torch, rest), enabled

    def _activate(self) -> None:
        if self._library is None:
            self._library = register(self, self.release.autocast_ops())

    # GradScaler
    def _scale(self, original):
        def scale(scaler, outputs):
            if id(scaler) not in self._scalers:
                self._scalers.add(id(scaler))
                self._scaler_seen(scaler)
            return original(scaler, outputs)
        return scale

    def _scaler_seen(self, scaler) -> None:
        if not scaler._enabled:
            if getattr(scaler, "_device", None) == "cuda":
                self._note("GradScaler('cuda') (torch.amp.GradScaler()'s default, or torch.cuda.amp.GradScaler) "
                           "disables itself without CUDA, on a Mac as here: the step runs without loss scaling; "
                           "write torch.amp.GradScaler(x.device.type) to scale on MPS")
            return
        if self.release.gradscaler_path() == "absent":
            message = "AttributeError: module 'torch.amp' has no attribute 'GradScaler' (it arrived in torch 2.3.0)"
            if self.recorder is not None:
                self.recorder.note_call(SCALER_OP, message)
            self._note(f"torch.amp.GradScaler does not exist in the predicted-for release ({message}); row "
                       f"{SCALER_OP}, and the scaler was traced as the installed torch runs it")

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _autocast_spelling(region) -> str:
    old = getattr(getattr(torch.cuda, "amp", None), "autocast", None)
    return "torch.cuda.amp.autocast()" if old is not None and isinstance(region, old) else "torch.autocast('cuda')"


def _call_site(frame, region) -> tuple[bool | None, str]:
    """(is the device_type argument of the torch.autocast call in `frame` a string literal — None when its source
    cannot be read —, "file.py:line")."""
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    if isinstance(region, torch.cpu.amp.autocast):
        return True, where  # torch.cpu.amp.autocast: CPU autocast by name
    try:
        line, end, col, end_col = list(frame.f_code.co_positions())[frame.f_lasti // 2]
        lines = [linecache.getline(frame.f_code.co_filename, n) for n in range(line, end + 1)]
        lines[-1] = lines[-1][:end_col]
        lines[0] = lines[0][col:]
        call = ast.parse("(" + "".join(lines) + ")", mode="eval").body
    except (AttributeError, SyntaxError, ValueError, IndexError, TypeError):  # co_positions: Python 3.11+
        return None, where
    if not isinstance(call, ast.Call):
        return None, where
    given = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device_type"), None)
    return isinstance(given, ast.Constant) and isinstance(given.value, str), where
