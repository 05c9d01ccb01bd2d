"""Probe stage (child side): a warm, device-free interpreter that forks probe workers on request.

    python -m opscan.probe.zygote --fd N --device cpu|cuda

Started once per pass with that pass's environment (PYTORCH_ENABLE_MPS_FALLBACK set or unset before
`import torch`, as the variable demands). Its first control message is the setup line (protocol.py: the test
double to load, if any). It imports what a worker imports and touches no device,
then for every request on its control socket (one byte carrying a socket fd) forks a worker that
serves probes on that socket in its own session. It reports `{"forked": pid}` and, when a worker
ends, `{"exit": pid, "returncode": rc}` (negative: the signal). It never forks once CUDA is
initialised here, nor for a backend that declares itself not forkable (MPS). EOF on the control
socket (the parent is gone) kills every worker and ends the zygote.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import traceback


def _send(ctl: socket.socket, message: dict) -> None:
    ctl.send(json.dumps(message).encode())


def _reap(ctl: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _send(ctl, {"exit": pid, "returncode": code})


def _refusal(backend) -> str | None:
    import torch

    if not getattr(backend, "forkable", False):
        return f"backend {backend.name!r} is not forkable: use spawned workers"
    if torch.cuda.is_initialized():
        return "CUDA is initialised in the zygote: forking it is unsafe"
    return None


def _child(fd: int, ctl: socket.socket, backend) -> None:
    ctl.close()
    os.setsid()
    code = 0
    try:
        from opscan.probe.worker import serve

        serve(socket.socket(fileno=fd), backend)
    except BaseException:  # noqa: BLE001 - report and end this worker only
        traceback.print_exc()
        code = 70
    os._exit(code)


def serve_forks(ctl: socket.socket, backend) -> None:
    """The zygote's loop: fork on request, report exits, stop on EOF."""
    children: set[int] = set()
    while True:
        _reap(ctl, children)
        if not select.select([ctl], [], [], 0.05)[0]:
            continue
        message, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        if not message:
            break
        refusal = _refusal(backend)
        if refusal or not fds:
            for fd in fds:
                os.close(fd)
            _send(ctl, {"refused": refusal or "no socket received"})
            continue
        pid = os.fork()
        if pid == 0:
            _child(fds[0], ctl, backend)
        os.close(fds[0])
        children.add(pid)
        _send(ctl, {"forked": pid})
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str] | None = None) -> None:
    """Import the worker's world, say ready, serve fork requests."""
    from opscan.probe.protocol import child_socket, read_setup

    ctl, device = child_socket("opscan-probe-zygote", argv)
    from opscan.probe.worker import preload

    backend = preload(device, read_setup(ctl.recv(65536).decode()))
    refusal = _refusal(backend)
    _send(ctl, {"refused": refusal} if refusal else {"ready": os.getpid()})
    if not refusal:
        serve_forks(ctl, backend)
    sys.exit(0)


if __name__ == "__main__":
    main()
