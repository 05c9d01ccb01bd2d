"""Probe stage: the records that cross the process boundary, as versioned JSON (never pickle).

A worker (or the zygote it is forked from) first reads one setup line (`{"v": 1, "setup": {"double": null}}`:
the test double to load instead of the real device, tests only) and says hello with its environment record;
then the parent sends one request line per probe (`{"v": 1, "pass": "off", "probe": ProbeCall}`) and the
worker answers with exactly one line, a `PassOutcome`. A worker that dies or hangs gets its outcome written by
the parent (`crash`, `timeout`). Stdlib only: the worker imports this module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import socket
from dataclasses import asdict, dataclass, field

from opscan.probe import comparison  # stdlib at import, like this module

VERSION = 1
PASSES = ("off", "on")  # PYTORCH_ENABLE_MPS_FALLBACK unset / "1" in the child before `import torch`
STATUSES = ("ran", "raised", "unbuildable", "crash", "timeout")


class ProtocolError(ValueError):
    """A line that is not a valid message of this protocol version."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: metadata, and recorded values for small integer/bool tensors."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    values: list | None = None  # row-major nested list (tolist()), or None: seeded / built
    offset: int = 0  # storage offset, as recorded (a view into a larger storage: bn(x[5:]), sigmas[i])
    host: bool = False  # stays on the CPU while the rest of the call is on the device (a CPU 0-dim operand)

    def to_dict(self) -> dict:
        """JSON form (`offset` and `host` only when set, so earlier plans and journals read the same)."""
        extra = {k: v for k, v in (("offset", self.offset), ("host", self.host)) if v}
        return {"dtype": self.dtype, "shape": list(self.shape), "stride": list(self.stride), "values": self.values,
                **extra}

    @classmethod
    def from_dict(cls, d: dict) -> TensorSpec:
        """Inverse of to_dict."""
        return cls(d["dtype"], tuple(d["shape"]), tuple(d["stride"]), d.get("values"), int(d.get("offset", 0)),
                   bool(d.get("host", False)))


@dataclass(frozen=True)
class Feed:
    """The forward call whose outputs a probe call consumes (saved statistics, indices, workspaces: feeds.py).

    The worker runs it on the probe's device first and hands its outputs to the call, so the call gets what that
    device's own forward makes (CUDA keeps float16 batch-norm statistics in float32; the CPU keeps them in
    float16); the CPU reference runs it the same way on the CPU. `shared`: (feed tensor, call tensor) pairs that
    are the same tensor in the step (the forward's input is the backward's `input`); `outputs`: (call tensor,
    position among the feed's tensor outputs) pairs. Tensors not shared are seeded with `seed` (rebuild.py)."""

    op: str
    tensors: tuple[TensorSpec, ...]
    spec: dict
    shared: tuple[tuple[int, int], ...]
    outputs: tuple[tuple[int, int], ...]
    seed: int

    def to_dict(self) -> dict:
        """JSON form."""
        return {"op": self.op, "tensors": [t.to_dict() for t in self.tensors], "spec": self.spec,
                "shared": [list(p) for p in self.shared], "outputs": [list(p) for p in self.outputs],
                "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict | None) -> Feed | None:
        """Inverse of to_dict (None stays None)."""
        if d is None:
            return None
        pairs = lambda key: tuple((int(a), int(b)) for a, b in d[key])  # noqa: E731
        return cls(str(d["op"]), tuple(TensorSpec.from_dict(t) for t in d["tensors"]), dict(d["spec"]),
                   pairs("shared"), pairs("outputs"), int(d["seed"]))

    def signature(self) -> str:
        """Canonical text: the forward's call signature and how it feeds the call."""
        return signature(self.op, self.tensors, self.spec) + json.dumps([self.shared, self.outputs])


@dataclass(frozen=True)
class ProbeCall:
    """One distinct call signature of the step, replayable in a fresh process.

    `spec` is trace/argspec.py's `{"args": [...], "kwargs": {...}}` with tensors as `{"t": i}`
    references into `tensors` (values moved into the TensorSpec). `id` is a hash of the signature
    (op, tensor metadata, arguments; values excluded), so a plan is stable across runs.
    """

    id: str
    op: str  # display spelling, "aten::add.Tensor"
    tensors: tuple[TensorSpec, ...]
    spec: dict
    seed: int
    note: str | None = None  # why the shapes stay full, when a cap was asked for and not possible
    shrink: dict | None = None  # size -> smaller size (shrink.py), applied by the worker when the CPU accepts it
    feed: Feed | None = None  # the forward that makes some of its inputs on the probe's device first

    def to_dict(self) -> dict:
        """JSON form (`feed` only when there is one: the form of a call without one is unchanged)."""
        shrink = {str(k): v for k, v in self.shrink.items()} if self.shrink else None
        out = {"id": self.id, "op": self.op, "tensors": [t.to_dict() for t in self.tensors],
               "spec": self.spec, "seed": self.seed, "note": self.note, "shrink": shrink}
        if self.feed is not None:
            out["feed"] = self.feed.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ProbeCall:
        """Inverse of to_dict."""
        shrink = {int(k): v for k, v in d["shrink"].items()} if d.get("shrink") else None
        return cls(d["id"], d["op"], tuple(TensorSpec.from_dict(t) for t in d["tensors"]), d["spec"],
                   int(d["seed"]), d.get("note"), shrink, Feed.from_dict(d.get("feed")))


def signature(op: str, tensors, spec: dict) -> str:
    """Canonical text of a call signature: op, tensor dtype/shape/stride (and storage offset and host placement
    where set), arguments (values excluded)."""
    metas = [[t.dtype, list(t.shape), list(t.stride)] + ([t.offset, t.host] if t.offset or t.host else [])
             for t in tensors]
    return json.dumps([op, metas, _without_values(spec)], sort_keys=True, separators=(",", ":"))


def new_call(op: str, tensors, spec: dict, feed: Feed | None = None) -> ProbeCall:
    """A ProbeCall with its id (the hash of its signature, with its feed's) and seed (from the id)."""
    text = signature(op, tensors, spec) + ("" if feed is None else "|feed:" + feed.signature())
    ident = probe_id(text)
    return ProbeCall(ident, op, tuple(tensors), spec, int(ident[:8], 16), feed=feed)


def probe_id(sig: str) -> str:
    """A short stable id for a signature."""
    return hashlib.sha256(sig.encode()).hexdigest()[:16]


def _without_values(spec):
    if isinstance(spec, dict):
        return {k: _without_values(v) for k, v in spec.items() if not ("t" in spec and k == "v")}
    if isinstance(spec, list):
        return [_without_values(v) for v in spec]
    return spec


@dataclass(frozen=True)
class Comparison:
    """How a pass's outputs compared with the reference (the rule and its tolerances: comparison.py).

    The reference is the same call on the CPU with floating inputs cast to float64 (complex to complex128);
    when the op refuses float64 it is the same call on the CPU in the probe's dtypes (`reference: "same-dtype"`).
    """

    how: str  # "elementwise" | "properties" | "shape" | "mixed" | "none" (nothing was compared)
    within: bool | None  # None: unchecked — no reference, or no output to compare: never "within tolerance"
    max_abs: float | None = None
    max_rel: float | None = None
    reference: str = "float64"  # "float64" | "same-dtype" | "none"
    detail: str | None = None  # what was beyond, or which property failed

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Comparison | None:
        """Inverse of to_dict (None stays None); ProtocolError naming a field of the wrong type."""
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ProtocolError(f"field 'comparison' is {_kind(d)}, not a record")
        checked(d, COMPARISON_TYPES, "comparison.")
        return cls(**d)

    @classmethod
    def of_outputs(cls, func, got: list, ref: list, dtypes, reference: str) -> Comparison:
        """Compare the probe's outputs `got` with `ref` (both on the CPU), leaf by leaf, by comparison.py's rule;
        an op with no output to compare is unchecked (`within` None), not within tolerance."""
        problem, err_abs, err_rel, _, how = comparison.compare(func, dtypes, got, ref)
        if problem is None and how == "none":
            return cls("none", None, reference=reference, detail="the call has no output to compare")
        return cls(how, problem is None, _finite(err_abs), _finite(err_rel), reference, problem)

    @classmethod
    def without_reference(cls, why: str) -> Comparison:
        """The record of a pass whose outputs could not be compared (no CPU reference): unchecked, never within."""
        return cls("none", None, reference="none", detail=f"no CPU reference: {why}")

    @property
    def checked(self) -> bool:
        """Something was compared. A record that compared nothing is unchecked whatever its `within` says:
        journals and bundle results written before `within: null` existed say `how: "none", within: true`."""
        return self.within is not None and self.how != "none"

    @property
    def beyond(self) -> bool:
        """Compared, and beyond tolerance."""
        return self.within is False


@dataclass(frozen=True)
class PassOutcome:
    """What one pass (fallback variable off or on) of one probe did: a result, never an exception."""

    probe: str
    pass_name: str
    status: str  # one of STATUSES
    exc_type: str | None = None
    message: str | None = None
    warnings: tuple[str, ...] = ()
    fallback_seen: bool = False
    comparison: Comparison | None = None
    signal: str | None = None  # crash: "SIGSEGV"; or "exit code 3"
    returncode: int | None = None
    duration: float = 0.0
    confirmed: str | None = None  # a failure seen in a pooled worker, re-run alone: what the pooled run saw
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON form (one line of the protocol, one line of the journal)."""
        d = asdict(self)
        d["v"] = VERSION
        d["warnings"] = list(self.warnings)
        d["comparison"] = self.comparison.to_dict() if self.comparison else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PassOutcome:
        """Validate and rebuild; raises ProtocolError on another version or an unknown status."""
        if d.get("v") != VERSION:
            raise ProtocolError(f"protocol version {d.get('v')!r}, expected {VERSION}")
        if d.get("status") not in STATUSES or d.get("pass_name") not in PASSES:
            raise ProtocolError(f"bad status/pass in {d!r:.200}")
        checked(d, OUTCOME_TYPES)
        fields = {k: v for k, v in d.items() if k != "v"}
        fields["warnings"] = tuple(fields.get("warnings") or ())
        fields["comparison"] = Comparison.from_dict(fields.get("comparison"))
        return cls(**fields)

    @property
    def clean(self) -> bool:
        """Ran and agreed with the reference: nothing that calls for a fresh process."""
        return self.status == "ran" and (self.comparison is None or not self.comparison.beyond)


# the JSON types of each field an outcome line may hold (None: null); what a results file from a Mac is checked
# against before merge uses it: a list where a message belongs is a refusal naming the field, never a crash later
_NUMBER = (int, float)
OUTCOME_TYPES = {"probe": (str,), "pass_name": (str,), "status": (str,), "exc_type": (str, None),
                 "message": (str, None), "warnings": (list,), "fallback_seen": (bool,), "comparison": (dict, None),
                 "signal": (str, None), "returncode": (int, None), "duration": _NUMBER, "confirmed": (str, None),
                 "extra": (dict,)}
COMPARISON_TYPES = {"how": (str,), "within": (bool, None), "max_abs": (*_NUMBER, None),
                    "max_rel": (*_NUMBER, None), "reference": (str,), "detail": (str, None)}
_NAMES = {str: "text", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a record"}


def checked(d: dict, types: dict, prefix: str = "") -> None:
    """ProtocolError naming the first field of `d` whose value is not of its type in `types` (a bool is no
    number; a float must be finite); the warnings must be text."""
    for name, allowed in types.items():
        if name not in d:
            continue
        value = d[name]
        ok = value is None and None in allowed or any(
            isinstance(value, t) and (t is bool or not isinstance(value, bool)) for t in allowed if t is not None)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            wanted = " or ".join("null" if t is None else _NAMES.get(t, t.__name__) for t in allowed)
            raise ProtocolError(f"field {prefix + name!r} is {_kind(value)}, not {wanted}")
    if not all(isinstance(w, str) for w in d.get("warnings") or ()):
        raise ProtocolError(f"field {prefix}'warnings' holds something other than text")


def _kind(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"a non-finite number ({value})"
    return "null" if value is None else _NAMES.get(type(value), f"a {type(value).__name__}")


def setup_line(double: dict | None) -> str:
    """The first line a worker or zygote reads: which test double to load (None: the real device)."""
    return dumps({"v": VERSION, "setup": {"double": double}})


def read_setup(line: str) -> dict | None:
    """The double named by a setup line (None: the real device); ProtocolError for anything else."""
    message = loads(line)
    if message.get("v") != VERSION or not isinstance(message.get("setup"), dict):
        raise ProtocolError(f"expected a setup line, got {line[:200]!r}")
    return message["setup"].get("double")


def dumps(obj: dict) -> str:
    """One protocol line (no newline inside; NaN written as null by the sender beforehand)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def loads(line: str) -> dict:
    """Parse one protocol line; raises ProtocolError when it is not a JSON object."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON: {line[:200]!r}") from exc
    if not isinstance(value, dict):
        raise ProtocolError(f"not a JSON object: {line[:200]!r}")
    return value


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def child_socket(prog: str, argv: list[str] | None = None) -> tuple[socket.socket, str]:
    """The socket and device a worker or zygote process was started with (launch.py's `--fd N --device D`)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", required=True)
    ns = parser.parse_args(argv)
    return socket.socket(fileno=ns.fd), ns.device
