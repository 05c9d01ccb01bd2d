"""Probe stage (parent side): run every probe, both passes, in isolated worker processes.

Pass "off" runs every probe with PYTORCH_ENABLE_MPS_FALLBACK unset; pass "on" (the variable "1")
runs the probes whose off pass raised (or all of them, `on_pass="always"`). Each pass has its own
processes, its environment set before `import torch`. A warm pool of `workers` processes runs many
probes each; after any probe that is not clean (it raised, crashed, hung or disagreed with the
reference) that worker is retired and the probe is re-run alone in a fresh one, whose outcome is
the one kept (`confirmed` says what the pooled run saw). A crash or a hang therefore costs that
probe only. Outcomes are handed to `on_outcome` as they arrive (the journal and the progress bar).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from opscan.probe.launch import EOF, TIMEOUT, LaunchError, SpawnLauncher, ZygoteLauncher, describe_exit
from opscan.probe.protocol import VERSION, PassOutcome, ProbeCall, ProtocolError, dumps, loads

FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"
THREADS_VAR = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class RunnerOptions:
    """How probes run: device, pool size, per-probe limit, isolation ("auto", "zygote", "spawn")."""

    device: str = "cpu"
    workers: int = 2
    timeout: float = 60.0
    isolation: str = "auto"
    on_pass: str = "when-needed"  # or "always"  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
    startup_timeout: float = 300.0
    log_path: str | None = None  # where workers' stderr goes (default: discarded)
    double: object = None  # backends.DeviceDouble: a test double instead of the device (tests only)


def pass_env(pass_name: str, base: dict | None = None, workers: int | None = None) -> dict:
    """The child environment of a pass: the variable removed (off) or "1" (on). With `workers`, each worker's
    share of the cores for torch's intra-op threads (OMP_NUM_THREADS, unless set): `workers` processes with a
    thread per core each would oversubscribe the machine and spin (the CPU references take most of a probe)."""
    env = dict(os.environ if base is None else base)
    env.pop(FALLBACK_VAR, None)
    if pass_name == "on":  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
        env[FALLBACK_VAR] = "1"
    if workers and THREADS_VAR not in env:
        env[THREADS_VAR] = str(max(1, (os.cpu_count() or 1) // workers))
    return env


def isolation_for(options: RunnerOptions) -> str:
    """Zygote forking where it is safe (Linux, a forkable backend); spawn on a Mac and for real MPS."""
    if options.isolation != "auto":
        return options.isolation
    if sys.platform == "darwin" or (options.device == "mps" and options.double is None):
        return "spawn"
    return "zygote"


class Pool:
    """`workers` warm processes of one pass; see the module docstring for what happens on a failure."""

    def __init__(self, pass_name: str, options: RunnerOptions, on_outcome: Callable[[PassOutcome], None],
                 on_hello: Callable[[dict], None] | None = None):
        self.pass_name, self.options, self.on_outcome, self.on_hello = pass_name, options, on_outcome, on_hello
        self.hello: dict | None = None
        self._lock = threading.Lock()
        self.launcher = self._launcher()

    def _launcher(self):
        env = pass_env(self.pass_name, workers=self.options.workers)
        stderr = _log(self.options.log_path) if self.options.log_path else None
        kind = isolation_for(self.options)
        if kind == "zygote":
            try:
                return ZygoteLauncher(self.options.device, env, self.options.startup_timeout, stderr,
                                      self.options.double)
            except LaunchError:
                pass  # a backend that refuses forking: fall back to fresh interpreters
        return SpawnLauncher(self.options.device, env, self.options.startup_timeout, stderr, self.options.double)

    def run(self, probes: list[ProbeCall]) -> dict[str, PassOutcome]:
        """Every probe's outcome for this pass."""
        todo: queue.Queue = queue.Queue()
        for probe in probes:
            todo.put(probe)
        results: dict[str, PassOutcome] = {}
        errors: list[BaseException] = []
        threads = [threading.Thread(target=self._drain, args=(todo, results, errors), daemon=True)
                   for _ in range(max(1, min(self.options.workers, len(probes))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.launcher.close()
        if errors:
            raise errors[0]
        return results

    def _drain(self, todo: queue.Queue, results: dict, errors: list) -> None:
        handle = None
        try:
            while True:
                try:
                    probe = todo.get_nowait()
                except queue.Empty:
                    break
                outcome, handle = self._probe(probe, handle)
                with self._lock:
                    results[probe.id] = outcome
                    self.on_outcome(outcome)
        except BaseException as exc:  # noqa: BLE001 - a launch failure ends the run, in the main thread
            errors.append(exc)
        finally:
            if handle is not None:
                handle.kill()

    def _start(self):
        handle, hello = self.launcher.start()
        with self._lock:  # the first hello is handed on before any outcome of the pass
            if self.hello is None and hello is not None:
                self.hello = hello
                if self.on_hello is not None:
                    self.on_hello(hello)
        return handle

    def _probe(self, probe: ProbeCall, handle):
        """(outcome, the handle to keep using or None)."""
        handle = handle or self._start()
        pooled = self.ask(handle, probe)
        if pooled.clean or pooled.status == "unbuildable":
            return pooled, handle
        if pooled.status not in ("crash", "timeout"):
            handle.kill()
        fresh = self._start()
        alone = replace(self.ask(fresh, probe), confirmed=f"pooled run: {outcome_summary(pooled)}; re-run alone in a "
                                                          "fresh process")
        if alone.clean or alone.status == "unbuildable":
            return alone, fresh
        if alone.status not in ("crash", "timeout"):
            fresh.kill()
        return alone, None

    def ask(self, handle, probe: ProbeCall) -> PassOutcome:
        """One probe on one of this pass's workers."""
        return ask(handle, probe, self.pass_name, self.options.timeout)


def ask(handle, probe: ProbeCall, pass_name: str, timeout: float) -> PassOutcome:
    """Send one probe to one worker; a dead or silent worker becomes a crash or timeout outcome."""
    start = time.perf_counter()
    reply = handle.request(dumps({"v": VERSION, "pass": pass_name, "probe": probe.to_dict()}), timeout)
    took = time.perf_counter() - start
    if reply == TIMEOUT:
        handle.kill()
        return PassOutcome(probe.id, pass_name, "timeout", message=f"no answer within {timeout:g} s; the "
                           "worker's process group was killed", duration=took)
    if reply == EOF:
        handle.sock.close()
        code = handle.exit_status()
        return PassOutcome(probe.id, pass_name, "crash", signal=describe_exit(code), returncode=code,
                           message="the worker died while running this probe", duration=took)
    try:
        return PassOutcome.from_dict(loads(reply))
    except (ProtocolError, TypeError, KeyError) as exc:
        handle.kill()
        return PassOutcome(probe.id, pass_name, "crash", signal="protocol error", message=f"unreadable answer: "
                           f"{exc}", duration=took)


def outcome_summary(outcome: PassOutcome) -> str:
    """A few words on an outcome (for `confirmed`)."""
    if outcome.status == "crash":
        return f"crash ({outcome.signal})"
    if outcome.status == "raised":
        return f"raised {outcome.exc_type}"
    if outcome.status == "ran":
        return "ran, beyond tolerance"
    return outcome.status


@dataclass(frozen=True)
class RunResult:
    """Both passes' outcomes by probe id, and each pass's environment record."""

    off: dict
    on: dict
    environments: dict
    reused: int = 0  # outcomes taken from the journal of an earlier run (--resume)


class Observer:
    """What a run reports as it goes (no-op here; the CLI's observer feeds the journal and the bar)."""

    def pass_started(self, pass_name: str, total: int) -> None:
        """A pass begins with `total` probes to run."""

    def outcome(self, outcome: PassOutcome) -> None:
        """One pass of one probe finished (called under a lock, in arrival order)."""

    def environment(self, pass_name: str, record: dict) -> None:
        """The first worker of a pass said where it runs."""


def run_probes(probes, options: RunnerOptions, done: dict | None = None, observer: Observer = Observer(),
               environments: dict | None = None) -> RunResult:
    """Both passes over `probes`; `done` holds outcomes from an earlier (resumed) run, keyed (id, pass)."""
    done = done or {}
    envs = dict(environments or {})
    passes: dict[str, dict] = {}
    reused = 0
    for pass_name in ("off", "on"):
        wanted = probes if pass_name == "off" else _needs_on(probes, passes["off"], options.on_pass)  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
        passes[pass_name] = {p.id: done[(p.id, pass_name)] for p in wanted if (p.id, pass_name) in done}
        reused += len(passes[pass_name])
        todo = [p for p in wanted if p.id not in passes[pass_name]]
        if todo:
            observer.pass_started(pass_name, len(todo))
            pool = Pool(pass_name, options, observer.outcome, partial(_hello, envs, observer, pass_name))
            passes[pass_name].update(pool.run(todo))
    return RunResult(passes["off"], passes["on"], envs, reused)


def _hello(envs: dict, observer: Observer, pass_name: str, record: dict) -> None:
    """A pass's first worker said hello: record its environment (journaled at once, before its outcomes: a run
    killed later keeps it) unless an earlier run already did."""
    if pass_name not in envs:
        envs[pass_name] = record
        observer.environment(pass_name, record)


def _needs_on(probes, off: dict, on_pass: str) -> list:
    if on_pass == "always":  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
        return [p for p in probes if off[p.id].status != "unbuildable"]
    return [p for p in probes if off[p.id].status == "raised"]


def _log(path: str):
    """The workers' stderr log, appended to (made when missing), never through a link planted at its name."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "ab")
