"""Probe stage: entry point — plan the probes of a traced step, run them, measure each row.

`measure(trace, view, options, model_name, session)` returns a `Measurement`: the per-row measurements,
the report's `measurement` section, and the plan and outcomes they came from (scan.py hands the first two
to the report). `ProbeSession` is the observer the CLI passes in: it opens the journal in the report folder
(resuming it when asked) and draws the progress bar. A device that cannot be used is a
`ProbeEnvironmentError` (exit 2), never a row.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opscan.errors import OpscanError
from opscan.probe import calls, reconcile, runner
from opscan.probe.journal import PROBES_JOURNAL, Journal
from opscan.probe.backends import DeviceDouble
from opscan.probe.launch import LaunchError

DEFAULT_MAX_ELEMENTS = 1 << 20
LOG_NAME = "probes.log"
DEVICES = ("cpu", "cuda", "mps")


class ProbeEnvironmentError(OpscanError):
    """The probe device or its worker processes cannot be used here."""


@dataclass(frozen=True)
class ProbeOptions:
    """How to measure: device, shape cap (None: full shapes), pool size, per-probe limit, isolation."""

    device: str = "mps"
    max_elements: int | None = DEFAULT_MAX_ELEMENTS
    workers: int = max(1, min(4, os.cpu_count() or 1))
    timeout: float = 60.0
    isolation: str = "auto"
    on_pass: str = "when-needed"  # noqa: S105 - a probe pass's name ('on'/'off'), not a password
    double: DeviceDouble | None = None  # tests only: a test double stands in for `device` (never from the CLI)


@dataclass(frozen=True)
class Measurement:
    """One measured run: rows (row key -> RowMeasurement), each MPS-view call's measured verdict (view order),
    where it ran, the report's section, the plan and its outcomes."""

    rows: dict
    call_verdicts: tuple
    where: reconcile.Where
    section: dict
    plan: calls.Plan
    result: runner.RunResult

    @property
    def stands_for_mps(self) -> bool:
        """Measured on mps (or on a test double of it): the verdicts, graph, transfers and lane are measured."""
        return self.where.stands_for_mps


class ProbeSession(runner.Observer):
    """Journal (in the report folder) and progress bar for one measured run."""

    probes_here = True  # False: the outcomes come from elsewhere (`opscan merge`), no device is used here

    def __init__(self, folder_for: Callable[[str], Path], resume: bool = False, progress=None):
        self.folder_for, self.resume, self.progress = folder_for, resume, progress
        self.journal: Journal | None = None
        self.name: str | None = None
        self.log_path: str | None = None  # the workers' stderr (crash tracebacks), next to the journal

    def open(self, plan, model_name: str) -> tuple[dict, dict]:
        """Open (or resume) the journal; returns the outcomes and environments already recorded."""
        folder = Path(self.folder_for(model_name))
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(folder / PROBES_JOURNAL, plan.fingerprint, plan.device, len(plan.probes), self.resume)
        self.name = PROBES_JOURNAL
        self.log_path = str(folder / LOG_NAME)
        return self.journal.done, self.journal.environments

    def pass_started(self, pass_name: str, total: int) -> None:
        """Start a bar for the pass."""
        if self.progress:
            self.progress.begin(pass_name, total)

    def outcome(self, outcome) -> None:
        """Journal first (it survives a kill), then the bar."""
        if self.journal:
            self.journal.outcome(outcome)
        if self.progress:
            self.progress.outcome(outcome)

    def environment(self, pass_name: str, record: dict) -> None:
        """Journal the pass's environment record."""
        if self.journal:
            self.journal.environment(pass_name, record)

    def close(self) -> None:
        """End the bar and close the journal."""
        if self.progress:
            self.progress.end()
        if self.journal:
            self.journal.close()


def measure(trace, view, options: ProbeOptions, model_name: str, session: ProbeSession | None = None) -> Measurement:
    """Plan, run and reconcile the probes of one traced step (on `options.double` instead of the device: tests)."""
    if options.double is None and (session is None or session.probes_here):
        check_device(options.device)
    plan = calls.plan(trace, view, options.device, options.max_elements)
    done, envs = session.open(plan, model_name) if session else ({}, {})
    run_options = runner.RunnerOptions(device=options.device, workers=options.workers, timeout=options.timeout,
                                       isolation=options.isolation, on_pass=options.on_pass,
                                       log_path=session.log_path if session else None, double=options.double)
    start = time.monotonic()
    try:
        result = runner.run_probes(list(plan.probes), run_options, done, session or runner.Observer(), envs)
    except LaunchError as exc:
        raise ProbeEnvironmentError(str(exc)) from None
    finally:
        if session:
            session.close()
    where = measured_on(options.device, result.environments)
    run = {"wall_s": round(time.monotonic() - start, 3), "reused_outcomes": result.reused}
    rows = reconcile.measure_rows(plan, result, where.label)
    section = reconcile.measurement_section(plan, result, run_options, where, runner.isolation_for(run_options),
                                session.name if session else None, run)
    return Measurement(rows, reconcile.measure_calls(plan, result), where, section, plan, result)


def measured_on(device: str, environments: dict) -> reconcile.Where:
    """Where the probes ran, from the workers' own environment records: a test double says `simulated` (it
    stands for the device it simulates, and the report says it was simulated); a real device is itself, and
    only mps stands for MPS. Records, not options: `opscan merge` has only the results file's records."""
    env = environments.get("off") or environments.get("on") or {}
    vm = env.get("virtual_machine") if isinstance(env.get("virtual_machine"), dict) else None
    virtual = (tuple(str(s) for s in vm.get("signals", ())) or ("detected",)) if vm and vm.get("detected") else ()
    if env.get("simulated"):
        label = env.get("backend") or "simulated"
        return reconcile.Where(f"{label} (virtual Mac)" if virtual else label,
                               env.get("device") == "mps" and not virtual, simulated=True, virtual=virtual)
    if virtual:
        return reconcile.Where(f"{device} (virtual Mac)", False, virtual=virtual)
    return reconcile.Where(device, device == "mps")


def check_device(device: str) -> None:
    """Refuse a device this machine cannot probe on, with the fix."""
    if device not in DEVICES:
        raise ProbeEnvironmentError(f"unknown probe device {device!r} — use one of {', '.join(DEVICES)}")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeEnvironmentError("--device cuda, but CUDA is not available here — use --device cpu, or --no-probe",
                                    api='device="cuda", but CUDA is not available here — use device="cpu", or leave '
                                        "device out to predict only")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ProbeEnvironmentError("MPS is not available here (measured mode needs a Mac) — pass --device cpu or "
                                    "cuda to measure this machine instead (it never stands in for MPS), or --no-probe",
                                    api='MPS is not available here (measuring needs a Mac) — pass device="cpu" or '
                                        '"cuda" to measure this machine instead (it never stands in for MPS), or '
                                        "leave device out to predict only")
