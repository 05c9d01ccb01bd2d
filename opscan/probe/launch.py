"""Probe stage (parent side): start worker processes and talk to them over a socket, one JSON line each way.

Two launchers, same handles:
- `SpawnLauncher`: every worker is a fresh interpreter (`python -m opscan.probe.worker`). Always safe;
  the only choice for real MPS (Metal and the Objective-C runtime are not fork-safe).
- `ZygoteLauncher`: one fresh interpreter per pass imports torch with that pass's environment and
  touches no device; each worker is forked from it (milliseconds instead of seconds). The zygote
  refuses to fork once CUDA is initialised in it, and refuses non-forkable backends.
Every worker leads its own process group: a timeout kills the whole group.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from opscan.probe.protocol import setup_line

TIMEOUT, EOF = "timeout", "eof"


class LaunchError(RuntimeError):
    """A worker (or zygote) could not be started: the run itself cannot go on."""


def describe_exit(returncode: int | None) -> str:
    """"SIGSEGV (signal 11)" / "exit code 3" / "unknown exit"."""
    if returncode is None:
        return "unknown exit"
    if returncode < 0:
        try:
            return f"{signal.Signals(-returncode).name} (signal {-returncode})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Handle:
    """One live worker: send a line, read a line with a deadline, kill its process group."""

    def __init__(self, sock: socket.socket, pid: int, wait_exit):
        self.sock, self.pid, self._wait_exit = sock, pid, wait_exit
        self._buffer = b""

    def request(self, line: str, timeout: float) -> str:
        """Send one line and return the answer line, TIMEOUT or EOF."""
        try:
            self.sock.sendall(line.encode() + b"\n")
        except OSError:
            return EOF
        return self.read(timeout)

    def read(self, timeout: float) -> str:
        """The next line, TIMEOUT or EOF."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                return TIMEOUT
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                return EOF
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def kill(self) -> None:
        """SIGKILL the worker's process group and close the channel."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.sock.close()

    def exit_status(self, timeout: float = 10.0) -> int | None:
        """The worker's return code (negative: killed by that signal), once it has exited."""
        return self._wait_exit(timeout)


def _hello(handle: Handle, timeout: float) -> dict:
    line = handle.read(timeout)
    if line in (TIMEOUT, EOF):
        handle.kill()
        raise LaunchError(f"a probe worker did not start ({line}; {describe_exit(handle.exit_status(5))}) — "
                          "run `python -m opscan.probe.worker --help` to check that opscan and torch import")
    return json.loads(line)["hello"]


class SpawnLauncher:
    """Each worker is a fresh interpreter with the pass's environment."""

    isolation = "spawn"

    def __init__(self, device: str, env: dict, startup_timeout: float = 300.0, stderr=None, double=None):
        self.device, self.env, self.startup_timeout, self.stderr = device, env, startup_timeout, stderr
        self.setup = setup_line(double.to_dict() if double is not None else None)

    def start(self) -> tuple[Handle, dict]:
        """A new worker and its hello (environment record)."""
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "opscan.probe.worker", "--fd", str(theirs.fileno()), "--device", self.device]
        proc = subprocess.Popen(cmd, env=self.env, pass_fds=(theirs.fileno(),), start_new_session=True,  # noqa: S603 - this interpreter and opscan's own worker module
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        theirs.close()
        handle = Handle(mine, proc.pid, lambda t: _wait(proc, t))
        try:
            mine.sendall(self.setup.encode() + b"\n")
        except OSError:
            pass  # a worker that died at once: _hello names its exit
        return handle, _hello(handle, self.startup_timeout)

    def close(self) -> None:
        """Nothing is shared between spawned workers."""


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


class ZygoteLauncher:
    """Workers forked from one warm, device-free interpreter per pass (see the module docstring)."""

    isolation = "zygote"

    def __init__(self, device: str, env: dict, startup_timeout: float = 300.0, stderr=None, double=None):
        self.startup_timeout = startup_timeout
        self._ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-m", "opscan.probe.zygote", "--fd", str(theirs.fileno()), "--device", device]
        self._proc = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),), start_new_session=True,  # noqa: S603 - this interpreter and opscan's own zygote module
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        theirs.close()
        self._ctl.send(setup_line(double.to_dict() if double is not None else None).encode())
        self._forked: queue.Queue = queue.Queue()
        self._exits: dict[int, int] = {}
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        first = self._recv(startup_timeout)
        if first is None or "ready" not in first:
            self.close()
            raise LaunchError(f"the probe zygote did not start: {first or describe_exit(_wait(self._proc, 5))}")
        threading.Thread(target=self._listen, daemon=True).start()

    def _recv(self, timeout: float) -> dict | None:
        if not select.select([self._ctl], [], [], timeout)[0]:
            return None
        data = self._ctl.recv(65536)
        return json.loads(data) if data else None

    def _listen(self) -> None:
        while True:
            try:
                data = self._ctl.recv(65536)
            except OSError:
                data = b""
            message = json.loads(data) if data else {"closed": True}
            if "exit" in message:
                with self._cond:
                    self._exits[message["exit"]] = message["returncode"]
                    self._cond.notify_all()
            else:
                self._forked.put(message)
            if "closed" in message:
                return

    def start(self) -> tuple[Handle, dict]:
        """Fork a worker from the zygote; returns it with its hello."""
        mine, theirs = socket.socketpair()
        with self._lock:
            try:
                socket.send_fds(self._ctl, [b"F"], [theirs.fileno()])
            except OSError as exc:
                raise LaunchError(f"the probe zygote is gone ({exc})") from None
            finally:
                theirs.close()
            try:
                reply = self._forked.get(timeout=60)
            except queue.Empty:
                reply = {"refused": "no answer from the zygote"}
        if "forked" not in reply:
            mine.close()
            raise LaunchError(f"the probe zygote could not fork a worker: {reply}")
        handle = Handle(mine, reply["forked"], lambda t, pid=reply["forked"]: self._wait_exit(pid, t))
        return handle, _hello(handle, self.startup_timeout)

    def _wait_exit(self, pid: int, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        """Close the control channel: the zygote kills its workers and exits."""
        try:
            self._ctl.shutdown(socket.SHUT_RDWR)  # wakes the listener; the zygote reads EOF
        except OSError:
            pass
        self._ctl.close()
        if _wait(self._proc, 10) is None:
            self._proc.kill()
            self._proc.wait()
