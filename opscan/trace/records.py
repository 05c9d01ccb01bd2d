"""Trace stage: the immutable records a trace hands to later stages.

No torch import here: records hold plain Python values (dtype names, shape tuples, device strings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opscan.opkey import OpKey

PHASES = ("forward", "loss", "backward", "optimizer")
STRIDED = "strided"


@dataclass(frozen=True)
class TensorMeta:
    """One tensor argument or result of a call."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    storage: int  # storage identity within this trace (same number = same storage)
    nbytes: int
    # element offset into the storage, as MPS would see it: a tensor the step receives (parameter, buffer, input)
    # is copied to MPS by `.to("mps")`, which starts it at offset 0, so offsets are counted from where it starts
    offset: int = 0
    requires_grad: bool = False
    host: bool = False  # stays on the CPU while the step runs on MPS (trace/tensors.py StoragePlaces)
    layout: str = STRIDED  # "sparse_coo", "sparse_csr", ... for a sparse tensor (torch.layout without "torch.")
    # a host tensor: the Trace.hosts ids of the tensors it was made from (or its own). Not part of its identity: a run
    # numbers sources as it meets them, and a short run's copied layers name those of the layer they copy (splice.py)
    host_from: tuple[int, ...] = field(default=(), compare=False, repr=False)

    @property
    def sparse(self) -> bool:
        """Whether the tensor has a sparse layout (COO or compressed)."""
        return self.layout != STRIDED

    def to_dict(self) -> dict:
        """JSON form (`layout` only for a non-strided tensor)."""
        out = {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "device": self.device,
            "storage": self.storage,
            "nbytes": self.nbytes,
            "offset": self.offset,
            "requires_grad": self.requires_grad,
            "host": self.host,
        }
        if self.layout != STRIDED:
            out["layout"] = self.layout
        if self.host_from:
            out["host_from"] = list(self.host_from)
        return out


@dataclass(frozen=True)
class CallSite:
    """Where the user's code made a call (trace/frames.py): the innermost frame of the user's own code — for a
    backward call, of the forward call that created the autograd node it runs — and the installed library's
    frame below it (`via`: the library's own line that called torch).

    `by`: "call" (a frame on the stack when the call was made; for a backward call whose node is not known, the
    line that called `backward()`), "node" (a backward call: the forward call that created its node), "factory"
    (no frame of the user's code was on the stack — opscan's default step ran the model, its loss or optimizer —
    so the target's factory, whose model it was, stands in: file and line of its `def`). Files: the user's
    absolute, a library's inside site-packages."""

    file: str | None  # None: no user frame and no factory of the user's (only `via`)
    line: int | None
    function: str | None  # the qualname of the user's function
    via: tuple[str, int, str] | None = None  # (file, line, qualname) of the library frame below
    by: str = "call"


@dataclass(frozen=True)
class HostSource:
    """A tensor that stays on the CPU while a Mac runs the step on MPS, and where it came from (the placement
    model, trace/tensors.py StoragePlaces and trace/host.py).

    `kind`: "factory" (a Python factory called without `device=`), "global" (a module-level tensor), "closure" (a
    tensor a function of the step closes over), "attribute" (a plain tensor attribute of a module: not a registered
    buffer, so `Module.to()` leaves it on the CPU) or "before-step" (a tensor made before the step, or outside
    torch's dispatcher — `torch.from_numpy`, a DataLoader's batch — that the step was not given) or "to-host" (the
    copy the user's `.cpu()` or `.to("cpu")` makes). `name` names it
    (`torch.arange`, `TARGETS`, `Net.mask`; None when unknown), `where` is the line that made it (a factory's call,
    a global's or attribute's assignment) or, when that is not known, the first line of the step that read it
    (`first_read` True)."""

    id: int
    kind: str
    name: str | None
    where: CallSite | None
    first_read: bool = False


@dataclass(frozen=True)
class OpCall:
    """One dispatched operator call, in order."""

    index: int
    op: OpKey
    phase: str
    module: str  # dotted module path ("" = the model itself / no module)
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    bookkeeping: bool = False
    fx_node: str | None = None
    module_source: str = "hooks"  # hooks | autograd | parameter | none
    node: int | None = None  # backward: sequence number of the autograd node being run
    parent: int | None = None  # set on the callees of a composite call (index of that call)
    expanded: bool = False  # re-dispatched to its composite kernel; its callees follow it
    attrs: tuple = ()  # positional then keyword arguments, JSON-safe; tensors as "<tensor>"
    args_spec: dict | None = None  # replayable arguments (trace/argspec.py), for measured mode
    raised: str | None = None  # "ExcType: message" when the call raised (and the step caught it)
    # the torch Python functions that issued it, innermost first ("torch/optim/adam.py:_single_tensor_adam", ...,
    # up to the one the step's code called); () when none did (the autograd engine, the step calling an op directly)
    py: tuple[str, ...] = ()
    caller: tuple[str, int] | None = None  # the first frame outside torch and opscan: (file, line) (trace/frames.py)
    where: CallSite | None = None  # the user's line that made the call (trace/frames.py); None: no user/library frame

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Input dtype signature (the report's row key with the OpKey)."""
        return tuple(t.dtype for t in self.inputs)


def recorded_call(index, op, phase, module, inputs, outputs, bookkeeping, fx_node, module_source, node, parent,
                  expanded, attrs, args_spec, raised, py, caller, where) -> OpCall:
    """`OpCall(...)` with every field given, made without the frozen dataclass's `__init__` (one
    `object.__setattr__` per field): the recorder makes one per call. The same object in every respect
    (tests/test_trace_records.py compares them, field by field)."""
    call = _NEW(OpCall)
    _SET(call, "__dict__", {
        "index": index, "op": op, "phase": phase, "module": module, "inputs": inputs, "outputs": outputs,
        "bookkeeping": bookkeeping, "fx_node": fx_node, "module_source": module_source, "node": node, "parent": parent,
        "expanded": expanded, "attrs": attrs, "args_spec": args_spec, "raised": raised, "py": py, "caller": caller,
        "where": where})
    return call


_NEW, _SET = object.__new__, object.__setattr__


@dataclass(frozen=True)
class FxInfo:
    """Whether torch.fx.symbolic_trace succeeded, and why not."""

    traced: bool
    reason: str | None = None
    nodes: int = 0


@dataclass(frozen=True)
class Trace:
    """Everything the trace stage saw of one training (or inference) step."""

    calls: tuple[OpCall, ...]
    model_class: str
    mode: str  # "train" | "inference"
    modules: tuple[tuple[str, str], ...]  # (path, class name) in model order
    fx: FxInfo
    torch_version: str
    device: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    groups: tuple = ()  # lens.Group records: super-op spans seen above the dispatcher
    asked: tuple = ()  # ((question, answer), ...): what the trace asked of its release (questions.py)
    registrations: tuple = ()  # ((OpKey, Registration), ...): custom ops the target registered (registrations.py)
    hosts: tuple[HostSource, ...] = ()  # the tensors that stay on the CPU on a Mac (TensorMeta.host_from names them)
    device_calls: tuple = ()  # device_calls.DeviceCall: the step's code that picks a device, as a Mac runs it

    def findable(self) -> tuple[OpCall, ...]:
        """Top-level calls that are device work (bookkeeping and composite callees excluded)."""
        return tuple(c for c in self.calls if not c.bookkeeping and c.parent is None)

    def met_device(self) -> tuple[HostSource, ...]:
        """The host sources whose tensors meet a device tensor in one call (as they would on a Mac), in order."""
        ids: dict[int, None] = {}
        for c in self.calls:
            if any(t.host for t in c.inputs) and not all(t.host for t in (*c.inputs, *c.outputs)):
                ids.update((i, None) for t in c.inputs if t.host for i in t.host_from)
        by_id = {h.id: h for h in self.hosts}
        return tuple(by_id[i] for i in ids if i in by_id)


@dataclass(frozen=True)
class Group:
    """A call seen above the dispatcher that MPS dispatches differently from the CPU trace.

    `mode` "replace": the CPU calls in [start, end) become one `forward` op on MPS, and backward
    calls run by the autograd nodes in `nodes` become one `backward` op per backward pass.
    `mode` "steer": the lens ran the op the way MPS does (e.g. the math path of attention), so the
    recorded calls already are what MPS dispatches; kept here for the report's notes.
    `call` (a "replace" group): the high-level call itself, as the lens saw it — its tensors' (dtype, shape,
    stride, storage offset, requires_grad) in argument order and its argspec — so a probe can replay the op MPS
    runs with the same arguments.
    """

    rule: str
    mode: str
    forward: OpKey | None
    backward: OpKey | None
    start: int
    end: int
    nodes: frozenset[int]
    dtypes: tuple[str, ...]
    module: str
    condition: str
    source: str
    call: tuple[tuple[tuple[str, tuple[int, ...], tuple[int, ...], int, bool], ...], dict] | None = None
