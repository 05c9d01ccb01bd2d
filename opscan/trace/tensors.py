"""Trace stage: the recorder's per-tensor work, kept small because it runs for every tensor of every call.

`StorageIds` numbers storages (real, meta or fake: a FakeTensor has meta storage of its own, shared by
its views); `describe` turns a tensor into a `TensorMeta` (one object per distinct metadata); `tensors_in`
lists the tensors of a dispatched call's arguments or results in pytree order (aten schemas nest at most
lists in tuples, so a two-level walk replaces `tree_leaves`). Names and sizes of dtypes and device names
are cached per object.
A data-dependent size or stride (an unbacked symbol under fake tensors) is recorded as -1, and the
tensor's bytes as 0 (byte sums downstream stay sums of known sizes).
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from opscan.trace.records import TensorMeta

UNKNOWN = -1  # a size or stride that depends on tensor values (fake tensors)
_STRIDED = torch.strided

_DTYPES: dict[torch.dtype, tuple[str, int]] = {}  # dtype -> (name, bytes per element)
_DEVICE_NAMES: dict[torch.device, str] = {}
_EXPIRED = torch.UntypedStorage._expired  # (StorageWeakRef.expired, without its two Python calls)


class StorageIds:
    """Small integers for storages; a freed storage's number is never reused. Also interns the TensorMetas
    `describe` makes (equal metadata, one object: fewer objects for the collector to walk)."""

    def __init__(self):
        self._live: dict[int, tuple[int, StorageWeakRef]] = {}
        self._next = 0
        self.metas: dict[tuple, TensorMeta] = {}

    def of(self, tensor: torch.Tensor) -> int:
        """The id of `tensor`'s storage (-1 for tensors without one)."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return -1
        known = self._live.get(storage._cdata)
        if known is not None and not _EXPIRED(known[1].cdata):
            return known[0]
        ref = StorageWeakRef(storage)  # holds a weak count: the address is not reused while we look
        self._next += 1
        self._live[ref.cdata] = (self._next, ref)
        return self._next


def describe(t: torch.Tensor, storages: StorageIds) -> TensorMeta:
    """dtype, shape, stride, device, storage id, bytes and layout of one tensor."""
    dtype = t.dtype
    known = _DTYPES.get(dtype)
    if known is None:
        known = _DTYPES[dtype] = (str(dtype).removeprefix("torch."), t.element_size())
    name, size = known
    device = t.device
    where = _DEVICE_NAMES.get(device)
    if where is None:
        where = _DEVICE_NAMES[device] = str(device)
    try:
        stride = t.stride()
    except (RuntimeError, NotImplementedError):  # sparse and other non-strided layouts
        stride = ()
    if t._has_symbolic_sizes_strides:
        shape, stride = concrete(t.shape), concrete(stride)
        nbytes = 0 if UNKNOWN in shape else _product(shape) * size  # 0: no negative byte sums
    else:
        shape = tuple(t.shape)
        nbytes = _product(shape) * size
    layout = t.layout
    key = (name, shape, tuple(stride), where, storages.of(t), nbytes,
           "strided" if layout is _STRIDED else str(layout).removeprefix("torch."))
    meta = storages.metas.get(key)
    if meta is None:
        meta = storages.metas[key] = TensorMeta(*key)
    return meta


def tensors_in(*values) -> list[torch.Tensor]:
    """The tensors among `values` (tensors, lists/tuples of them, dicts of those), in order."""
    out: list[torch.Tensor] = []
    for value in values:
        _collect(value, out)
    return out


def _collect(value, out: list) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                out.append(item)
            elif isinstance(item, (list, tuple, dict)):
                _collect(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, out)


def concrete(dims) -> tuple[int, ...]:
    """Sizes or strides as ints, UNKNOWN for a data-dependent (unbacked symbolic) one."""
    out = []
    for d in dims:
        if type(d) is int:
            out.append(d)
            continue
        hint = d.node.maybe_as_int() if isinstance(d, torch.SymInt) else None
        out.append(UNKNOWN if hint is None else int(hint))
    return tuple(out)


def _product(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total
