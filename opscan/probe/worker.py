"""Probe stage (child side): run probes one at a time and answer each with exactly one JSON line.

    python -m opscan.probe.worker --fd N --device cpu|cuda|mps

The parent sets PYTORCH_ENABLE_MPS_FALLBACK in this process's environment before it starts (the
variable is read once, at `import torch`). A spawned worker reads the setup line (protocol.py: the test
double to load, if any) before anything else; a forked one got its backend from the zygote. The worker
sends a hello line (its environment record),
then for each request line: builds the inputs, runs the op on the device, synchronizes, compares
with the reference and writes one `PassOutcome` line on its socket. Warn-once is defeated
(`torch.set_warn_always(True)`, `warnings.simplefilter("always")`), so every fallback warning of
every probe is seen. Light on purpose: torch, op_probes and opscan.probe's worker-side modules only.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time
import warnings
from functools import partial

import torch

from opscan.probe import backends, comparison, replay, shrink
from opscan.probe.rebuild import BuildError, collect
from opscan.probe.protocol import VERSION, Comparison, PassOutcome, ProbeCall, child_socket, dumps, loads, read_setup
from opscan.probe.texts import fallback_ops

MESSAGE_LIMIT = 4000


def preload(device: str, double: dict | None = None):
    """Everything a worker imports, done before any fork: the backend (not yet prepared; a test double when the
    setup line named one) and op_probes."""
    import op_probes  # noqa: F401  (builders register at import; a broken registry fails here, loudly)

    return backends.load_backend(device, backends.DeviceDouble.from_dict(double))


def serve(sock: socket.socket, backend) -> None:
    """Hello, then one outcome line per request line until the parent closes the socket."""
    os.dup2(2, 1)  # C-level prints land on stderr: the protocol has its own channel
    sys.stdout = sys.stderr
    faulthandler.enable()
    backend.prepare()
    torch.set_warn_always(True)
    reader = sock.makefile("rb")
    _send(sock, {"v": VERSION, "hello": backend.describe()})
    for raw in reader:
        request = loads(raw.decode())
        outcome = run_one(ProbeCall.from_dict(request["probe"]), request["pass"], backend)
        _send(sock, outcome.to_dict())


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(dumps(message).encode() + b"\n")


def run_one(call: ProbeCall, pass_name: str, backend) -> PassOutcome:
    """One pass of one probe, as data: a raised exception is an outcome like any other."""
    start = time.perf_counter()
    try:
        func = replay.resolve(call.op)
        used, tensors, reference, shapes, feed = _prepare(call, func)
    except BuildError as exc:
        return PassOutcome(call.id, pass_name, "unbuildable", "BuildError", str(exc))
    got, error, caught = _run_on_device(used, func, tensors, backend, feed)
    seen = fallback_ops(caught)
    common = dict(warnings=tuple(w[:MESSAGE_LIMIT] for w in caught[:20]), fallback_seen=bool(seen),
                  extra={"fallback_ops": seen, "shapes": shapes, **_fed(used, feed)})
    if isinstance(error, BuildError):  # an argument that cannot be decoded here
        return PassOutcome(call.id, pass_name, "unbuildable", "BuildError", str(error))
    if error is not None:
        return PassOutcome(call.id, pass_name, "raised", type(error).__name__, _message(error),
                           duration=time.perf_counter() - start, **common)
    comparison = _compare(used, func, got, reference)
    return PassOutcome(call.id, pass_name, "ran", comparison=comparison, duration=time.perf_counter() - start,
                       **common)


def _prepare(call: ProbeCall, func):
    """(the call to run, its CPU tensors, the reference or why there is none, which shapes, its feed: a Fed,
    a string saying why it has none, or None).

    The reference runs first, on the CPU: a capped call whose reference fails is not trusted (its
    shapes may disagree in a way meta kernels accept) and the probe falls back to its full shapes."""
    if call.shrink:
        capped = shrink.apply(call)
        try:
            tensors = replay.build(capped, func)
            feed = _feed(capped)
        except BuildError:
            tensors = None
        reference = _reference(capped, func, tensors, feed) if tensors is not None else None
        if isinstance(reference, tuple):
            return capped, tensors, reference, "capped", feed
        why = reference or "its inputs could not be built"
        full_note = f"full: the capped call failed on the CPU ({why[:200]})"
    else:
        full_note = "full"
    tensors = replay.build(call, func)
    feed = _feed(call)
    return call, tensors, _reference(call, func, tensors, feed), full_note, feed


def _feed(call):
    """The call's forward, ready to run (a Fed), why it has none although it has a feed (a string), or None."""
    fed, why = replay.feed_of(call)
    return fed if fed is not None else why


def _fed(call, feed) -> dict:
    """The outcome's record of the call's feed: which forward made which inputs, and where."""
    if call.feed is None:
        return {}
    made = feed if isinstance(feed, str) else feed.made
    return {"feed": {"op": call.feed.op, "inputs": [c for c, _ in call.feed.outputs], "made": made}}


def _reference(call, func, tensors, feed=None):
    """(outputs, "float64" | "same-dtype") from the CPU, or the reason there is none (a string); the inputs the
    call's forward makes are made by it on the CPU, widened like the call."""
    feed = feed if not isinstance(feed, str) else None
    why = ""
    for wide, label in comparison.references(func):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args, kwargs = replay.materialize(call, tensors, "cpu", wide=wide, feed=feed)
                return collect(func, func(*args, **kwargs), args, kwargs), label
        except Exception as exc:  # noqa: BLE001 - this reference cannot run: try the next one
            why = f"{type(exc).__name__}: {_message(exc)[:300]}"
    return why


def _run_on_device(call, func, tensors, backend, feed=None):
    """(outputs on the CPU, the exception or None, warning texts). The call's forward (its feed) runs on the
    device first; its warnings (a fallback of the forward) are not the call's."""
    feed = feed if not isinstance(feed, str) else None
    forward = 0
    if feed is not None:
        feed.label = backend.name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.set_warn_always(True)
        try:
            args, kwargs = replay.materialize(call, tensors, backend.device, wide=False, feed=feed,
                                              run_op=partial(_synced, backend))
            forward = len(caught)
            out = backend.call(func, args, kwargs)
            backend.sync()
            got = [_host(v) for v in collect(func, out, args, kwargs)]
            backend.sync()
            error = None
        except Exception as exc:  # noqa: BLE001 - the op's failure is the measurement
            got, error = None, exc
    if feed is not None and forward:
        feed.made = f"{feed.made}; the forward warned: {str(caught[0].message)[:200]}"
    return got, error, [str(w.message) for w in caught[forward:]]


def _synced(backend, func, args, kwargs):
    """Run the call's forward on the device and wait for it: an asynchronous error is the forward's own."""
    out = backend.call(func, args, kwargs)
    backend.sync()
    return out


def _host(value):
    return value.detach().to("cpu") if isinstance(value, torch.Tensor) else value


def _compare(call, func, got, reference):
    if isinstance(reference, str):
        return Comparison.without_reference(reference)
    outputs, label = reference
    return Comparison.of_outputs(func, got, outputs, [t.dtype for t in call.tensors], label)


def _message(exc: BaseException) -> str:
    return str(exc)[:MESSAGE_LIMIT]


def main(argv: list[str] | None = None) -> None:
    """Entry point of a freshly spawned worker (a new interpreter: nothing was forked)."""
    sock, device = child_socket("opscan-probe-worker", argv)
    setup = sock.makefile("rb").readline().decode()  # the parent sends nothing more until the hello
    serve(sock, preload(device, read_setup(setup)))


if __name__ == "__main__":
    main()
