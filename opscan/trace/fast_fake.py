"""Trace stage: a FakeTensorMode whose repeated calls are cheap (what makes a 70B step scan in seconds).

FakeTensorMode caches repeated calls too, but keys each call by extracting every argument's full metadata
and rebuilds outputs through generic checks, which costs more than the rest of opscan's recording.
`FastFakeMode` puts a smaller cache in front of it (call_cache.py: what the key holds, how outputs are
rebuilt, what is never served). Everything the cache does not serve goes to FakeTensorMode unchanged, as do
fake constants (AdamW's step counters) and real tensors. `crosscheck=True` also runs FakeTensorMode on every
hit and compares.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from opscan.trace.call_cache import CallCache

_LAYER_NORM = torch.ops.aten.native_layer_norm.default


class FakeCache(CallCache):
    """The cache for the fake tensors of one FakeTensorMode (not constants, symbolic or subclass originals)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def owns(self, t) -> bool:
        """(dispatch_keys is set for mkldnn and subclass originals; FakeTensor.is_mkldnn is slow)"""
        return not (type(t) is not FakeTensor or t.fake_mode is not self.mode or t.constant is not None
                    or t._has_symbolic_sizes_strides or t.is_sparse or t.dispatch_keys is not None)

    def device(self, t):
        """The fake device (the meta storage underneath is not what the tensor reports)."""
        return t.fake_device

    def wrap(self, empty: torch.Tensor, device):
        """A FakeTensor of the mode over the rebuilt meta tensor."""
        return FakeTensor(self.mode, empty, device)


class FastFakeMode(FakeTensorMode):
    """FakeTensorMode with the cache described in the module docstring."""

    def __init__(self, *, crosscheck: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.crosscheck = crosscheck
        self.cache = FakeCache(self)

    @property
    def hits(self) -> int:
        """Calls served from the cache so far."""
        return self.cache.hits

    def dispatch(self, func, types, args=(), kwargs=None):
        """FakeTensorMode's result (see _cached), with the CPU kernel's statistics dtype for mixed layer norm."""
        out = self._cached(func, types, args, kwargs or {})
        return self._mixed_layer_norm(args, out) if func is _LAYER_NORM else out

    def _mixed_layer_norm(self, args, out):
        """layer_norm_cpu keeps mean and rstd in the parameters' float32 when a bfloat16/float16 input
        meets float32 weights (autocast); torch's fake kernel gives them the input's dtype.
        (aten/src/ATen/native/layer_norm.cpp: param_scalar_type(input, is_mixed_type(...)))"""
        x, params = args[0], [t for t in args[2:4] if isinstance(t, torch.Tensor)]  # weight, bias
        mixed = x.dtype in (torch.bfloat16, torch.float16) and params and all(
            t.dtype == torch.float32 for t in params)
        if not mixed or getattr(x, "fake_device", x.device).type != "cpu":
            return out
        y, mean, rstd = out
        return y, self._retyped(mean, torch.float32), self._retyped(rstd, torch.float32)

    def _retyped(self, t, dtype):
        if t.dtype == dtype:
            return t
        with torch._C.DisableTorchFunction():
            empty = torch.empty_strided(tuple(t.shape), t.stride(), dtype=dtype, device="meta")
        return FakeTensor(self, empty, t.fake_device)

    def _cached(self, func, types, args, kwargs):
        """Serve a repeated call from the cache; otherwise FakeTensorMode's dispatch, remembered."""
        run = lambda: super(FastFakeMode, self).dispatch(func, types, args, kwargs)  # noqa: E731
        check = (lambda out, inputs: _compare(out, run(), inputs, func)) if self.crosscheck else None
        return self.cache.call(func, args, kwargs, run, check)


def _compare(mine, theirs, inputs: list, func) -> None:
    """crosscheck: the rebuilt outputs must match FakeTensorMode's in metadata and aliasing."""
    pairs = list(zip(mine, theirs)) if isinstance(mine, (tuple, list)) else [(mine, theirs)]
    for a, b in pairs:
        if (a is None) != (b is None):
            raise AssertionError(f"fast fake cache: {func} returned {a!r}, FakeTensorMode {b!r}")
        if a is not None and _described(a, inputs) != _described(b, inputs):
            raise AssertionError(f"fast fake cache: {func} gave {_described(a, inputs)}, "
                                 f"FakeTensorMode {_described(b, inputs)}")


def _described(t, inputs: list) -> tuple:
    alias = next((("same", i) for i, x in enumerate(inputs) if x is t), None) or next(
        (("view", i) for i, x in enumerate(inputs) if x.untyped_storage()._cdata == t.untyped_storage()._cdata),
        ("fresh",))
    return (alias, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, t.requires_grad,
            t.is_conj(), t.is_neg())
