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

from math import prod

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from opscan.trace.records import HostSource, TensorMeta

UNKNOWN = -1  # a size or stride that depends on tensor values (fake tensors)
_STRIDED = torch.strided

_DTYPES: dict[torch.dtype, tuple[str, int]] = {}  # dtype -> (name, bytes per element)
_DEVICE_NAMES: dict[torch.device, str] = {}
_EXPIRED = torch.UntypedStorage._expired  # (StorageWeakRef.expired, without its two Python calls)


class StorageIds:
    """Small integers for storages; a freed storage's number is never reused. Also interns the TensorMetas
    `describe` makes (equal metadata, one object: fewer objects for the collector to walk), and holds the
    step's `StoragePlaces` (which storages stay on the host while the step runs on MPS)."""

    def __init__(self):
        self._live: dict[int, tuple[int, StorageWeakRef]] = {}
        self._next = 0
        self.metas: dict[tuple, TensorMeta] = {}
        self.placement = StoragePlaces()

    def of(self, tensor: torch.Tensor) -> int:
        """The id of `tensor`'s storage (-1 for tensors without one)."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return -1
        known = self._live.get(storage._cdata)
        if known is not None and not _EXPIRED(known[1].cdata):
            return known[0]
        return self.new(storage)

    def new(self, storage) -> int:
        """A number for a storage met for the first time (or whose address a freed one had)."""
        ref = StorageWeakRef(storage)  # holds a weak count: the address is not reused while we look
        self._next += 1
        self._live[ref.cdata] = (self._next, ref)
        return self._next


class StoragePlaces:
    """Where the storages of a step live when it runs on MPS, told apart in a CPU trace: the placement model.

    The step's own tensors — parameters, buffers and inputs (`given`) — are the ones a user moves to MPS with
    `.to("mps")`; so is everything an op makes from at least one of them, a factory call that dispatches with no
    tensor argument (`torch.zeros(n, device=x.device)` and `torch.zeros(n)` dispatch alike) unless the Python call
    had no `device=`, and what the user's own `.to(device)` of a host tensor returns (trace/host.py). A storage
    stays on the host (`host`) when it existed before the step without being one of the given tensors (a plain
    tensor attribute, a module-level tensor, a scheduler's `sigmas`: `model.to("mps")` leaves it on the CPU), when
    a Python factory made it without a `device=` argument (trace/host.py: `torch.linspace(...)`,
    `torch.tensor(...)`), when the user's code moved it there (`.cpu()`, `.to("cpu")`: trace/moves.py), or when
    every tensor argument of the op that made it was on the host (`sigmas[i]`, `probs.cpu().double()`).
    Each host storage keeps the ids of the `HostSource`s it comes from (`roots`): its own when it is one, those of
    the host tensors an op made it from otherwise. A given tensor's storage offset is counted from where that
    tensor starts (`base`): `.to("mps")` copies it to a fresh storage at offset 0.
    Off (`tracking` False) until the recorder is told the given tensors: every tensor is then on the device.

    Set from outside while a call runs: `site` (the CallSite of the call being recorded, the recorder's),
    `factory` (the name of a Python factory running without `device=`, or of the user's `.cpu()`/`.to("cpu")`
    with `factory_kind` "to-host": what it makes is a host source),
    `moving` (a `.to(device)` of a host tensor is running: what it makes lands on the device). `named` maps the
    storages of tensors that existed before the step to (kind, name, CallSite of their assignment or None)."""

    def __init__(self):
        self.tracking = False
        self.given: set[int] = set()
        self.made: set[int] = set()
        self.host: set[int] = set()
        self.base: dict[int, int] = {}
        self.roots: dict[int, tuple[int, ...]] = {}
        self.sources: list[HostSource] = []
        self.named: dict[int, tuple] = {}
        self.site = None
        self.factory: str | None = None
        self.factory_kind = "factory"  # "to-host" while the user's `.cpu()` / `.to("cpu")` runs (trace/moves.py)
        self.moving = 0
        self._factory_root: tuple[str, int] | None = None  # (factory, source id) of the factory call running

    def give(self, sid: int, offset: int) -> None:
        """A storage of a tensor the step is given (moved to MPS with it), starting at `offset`."""
        self.tracking = True
        self.given.add(sid)
        self.base[sid] = min(offset, self.base.get(sid, offset))

    def is_host(self, sid: int) -> bool:
        """Whether a storage is (or, when first read, will be) on the host."""
        return sid in self.host or (self.tracking and sid >= 0 and sid not in self.given and sid not in self.made)

    def read(self, sid: int) -> bool:
        """Whether a storage an op reads is on the host. A storage first met here existed before the step without
        being given — it stays on the CPU, a source of its own — unless a Python factory is running: then it is the
        factory's own tensor (`torch.tensor(data)` makes one outside the dispatcher and lifts it), where the factory
        makes it."""
        if self.tracking and sid not in self.given and sid not in self.made and sid >= 0 and sid not in self.host:
            if self.moving:
                self.made.add(sid)
            elif self.factory is not None:
                self.mark_host(sid, self.factory_source())
            else:
                kind, name, where = self.named.get(sid, ("before-step", None, None))
                self._host(sid, (self._source(kind, name, where or self.site, where is None),))
        return sid in self.host

    def made_by(self, sids, roots: tuple[int, ...] = ()) -> None:
        """Storages an op returned: on the device while a `.to(device)` runs; on the host when a factory without
        `device=` made them (a source of their own) or when every tensor argument was (`roots`: theirs)."""
        for sid in sids:
            if sid in self.given or sid in self.made or sid in self.host:
                continue  # an in-place op or a view: the storage keeps its place
            self.made.add(sid)
            if self.moving:
                continue
            if self.factory is not None:
                self._host(sid, (self.factory_source(),))
            elif roots:
                self._host(sid, roots)

    def factory_source(self) -> int:
        """The source id of the factory call running now (one per call, however many storages it makes)."""
        if self._factory_root is None or self._factory_root[0] is not self.factory:
            self._factory_root = (self.factory, self._source(self.factory_kind, self.factory, self.site))
        return self._factory_root[1]

    def end_factory(self) -> None:
        """The factory call has returned."""
        self.factory, self.factory_kind, self._factory_root = None, "factory", None

    def mark_host(self, sid: int, root: int) -> None:
        """A storage that is on the host from `root` on (a factory's result the recorder did not see made)."""
        self.made.add(sid)
        self._host(sid, (root,))

    def _host(self, sid: int, roots: tuple[int, ...]) -> None:
        self.host.add(sid)
        self.roots[sid] = roots

    def _source(self, kind: str, name: str | None, where, first_read: bool = False) -> int:
        self.sources.append(HostSource(len(self.sources) + 1, kind, name, where, first_read))
        return len(self.sources)


def describe(t: torch.Tensor, storages: StorageIds, made_from: tuple[int, ...] | None = None) -> TensorMeta:
    """dtype, shape, stride, device, storage id, bytes, storage offset (from where a given tensor starts),
    requires_grad and whether it stays on the host (StoragePlaces, with the sources it comes from) of one tensor:
    an argument the op reads (`made_from` None) or a result of an op (`made_from`: the sources of its tensor
    arguments when they were all on the host, else ()), and its layout. Each attribute is read once, and the
    placement model is asked only about a storage it has not placed yet."""
    dtype = t.dtype
    known = _DTYPES.get(dtype)
    if known is None:
        known = _DTYPES[dtype] = (str(dtype).removeprefix("torch."), t.element_size())
    device = t.device
    where = _DEVICE_NAMES.get(device)
    if where is None:
        where = _DEVICE_NAMES[device] = str(device)
    shape, stride, nbytes, offset = _sizes(t, known[1])
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        sid = -1
    else:
        known_id = storages._live.get(storage._cdata)
        sid = known_id[0] if known_id is not None and not _EXPIRED(known_id[1].cdata) else storages.new(storage)
    placement = storages.placement
    if placement.tracking and sid not in placement.made and sid not in placement.given:
        if made_from is None:
            placement.read(sid)
        else:
            placement.made_by((sid,), made_from)
    if offset < 0:
        offset = UNKNOWN
    elif placement.base:
        offset -= placement.base.get(sid, 0)
    layout = t.layout
    key = (known[0], shape, tuple(stride), where, sid, nbytes, offset, t.requires_grad, sid in placement.host,
           "strided" if layout is _STRIDED else str(layout).removeprefix("torch."), placement.roots.get(sid, ()))
    meta = storages.metas.get(key)
    if meta is None:
        meta = storages.metas[key] = TensorMeta(*key)
    return meta


def _sizes(t: torch.Tensor, itemsize: int) -> tuple[tuple, tuple, int, int]:
    """(shape, stride, bytes, storage offset) of `t`, each read once (`describe`'s; -1 for what depends on tensor
    values, whose bytes count 0: no negative byte sums)."""
    if t._has_symbolic_sizes_strides:
        shape = concrete(t.shape)
        return shape, concrete(_stride(t)), 0 if UNKNOWN in shape else prod(shape) * itemsize, _offset(t)
    shape = tuple(t.shape)
    try:
        stride = t.stride()
    except (RuntimeError, NotImplementedError):  # sparse and other non-strided layouts
        stride = ()
    try:
        offset = t.storage_offset()
    except (RuntimeError, NotImplementedError):
        offset = 0
    return shape, stride, prod(shape) * itemsize, offset if type(offset) is int else concrete((offset,))[0]


def _stride(t: torch.Tensor) -> tuple:
    try:
        return t.stride()
    except (RuntimeError, NotImplementedError):  # sparse and other non-strided layouts
        return ()


def _offset(t: torch.Tensor) -> int:
    try:
        offset = t.storage_offset()
    except (RuntimeError, NotImplementedError):  # sparse and other non-strided layouts
        return 0
    return offset if type(offset) is int else concrete((offset,))[0]


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
