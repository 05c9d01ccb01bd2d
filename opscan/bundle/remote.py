"""Bundle (runs on the Mac): `python -m opscan.bundle.remote BUNDLE` — a bundle's probes, both fallback
passes, then its repro scripts, into BUNDLE/results/results.jsonl (format: results.py).

run.sh starts it with the bundle's src/ first on PYTHONPATH: this module, the runner and the workers
need only the standard library and torch, and every opscan module they load comes from the bundle
(the `runner` line of the results lists them). A rerun resumes: the torn last line is dropped, no probe
or repro script runs twice, and a finished file is left as it is. Progress goes to stderr (run.sh sends
it to results/logs/run.log); exit 0 when the results are complete, 2 when the bundle cannot be run.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from opscan import __version__
from opscan.bundle import MANIFEST, PROBES, RESULTS
from opscan.bundle.results import VERSION, bundle_problem, digest, parse_lines
from opscan.errors import OpscanError
from opscan.probe.protocol import PassOutcome, ProbeCall
from opscan.probe.runner import FALLBACK_VAR, Observer, RunnerOptions, isolation_for, run_probes

OUTPUT_LIMIT = 20000  # characters of a repro script's output kept (the end of it)


class BundleRunError(OpscanError):
    """The bundle cannot be run here (modified files, results of another bundle, a bad results line)."""


class ResultsWriter(Observer):
    """The results journal: opened fresh or resumed; every record flushed and fsynced. Holds an exclusive lock
    on results/.lock while open: a second run on the same bundle is refused."""

    def __init__(self, path: Path, header: dict):
        self.path, self.header = path, header
        self._lock = hold_lock(path.parent)
        data = path.read_bytes() if path.is_file() else b""
        entries, size, bad = parse_lines(data)
        if bad is not None:
            raise BundleRunError(f"{path}: line {bad} is not JSON — move results/ away to start over")
        if entries and entries[0].get("bundle") != header["bundle"]:
            raise BundleRunError(f"{path} holds another bundle's results — move results/ away to start over")
        self.fresh, self.complete = not entries, bool(entries) and entries[-1].get("kind") == "end"
        self.done = {(e["probe"], e["pass_name"]): PassOutcome.from_dict({k: v for k, v in e.items() if k != "kind"})
                     for e in entries if e.get("kind") == "outcome"}
        self.environments = {e["pass"]: e["environment"] for e in entries if e.get("kind") == "environment"}
        self.repro = {e["script"] for e in entries if e.get("kind") == "repro"}
        self.counts = {"off": 0, "on": 0}
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - held for the whole run
        self._file.truncate(size)
        if self.fresh:
            self.write({"kind": "header", "journal": 1, **header})

    def write(self, entry: dict) -> None:
        """Append one record; it survives a kill once this returns."""
        self._file.write(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def pass_started(self, pass_name: str, total: int) -> None:
        """Log the pass."""
        print(f"opscan bundle: pass {pass_name}: {total} probes to run", file=sys.stderr, flush=True)

    def outcome(self, outcome: PassOutcome) -> None:
        """Journal one outcome; log progress every 25."""
        self.write({"kind": "outcome", **outcome.to_dict()})
        self.counts[outcome.pass_name] += 1
        if self.counts[outcome.pass_name] % 25 == 0 or outcome.status != "ran":
            print(f"opscan bundle: {outcome.pass_name} {self.counts[outcome.pass_name]} done; {outcome.probe} "
                  f"{outcome.status}", file=sys.stderr, flush=True)

    def environment(self, pass_name: str, record: dict) -> None:
        """Journal a pass's environment record."""
        self.write({"kind": "environment", "pass": pass_name, "environment": record})

    def finish(self, counts: dict) -> None:
        """The end line: counts and the digest of everything before it."""
        self._file.close()
        body = self.path.read_bytes()
        self._file = open(self.path, "ab")  # noqa: SIM115
        self.write({"kind": "end", "counts": counts, "digest": digest(body)})
        self._file.close()


def hold_lock(folder: Path):
    """The open, exclusively locked folder/.lock (held until closed or the process ends); BundleRunError when
    another process holds it, naming its pid (results/run.pid of --detach, else the holder's own record)."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / ".lock", "a+")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid_file = folder / "run.pid"
        pid = (pid_file.read_text().strip() if pid_file.is_file() else "") or handle.read().strip() or "?"
        handle.close()
        raise BundleRunError(f"another run.sh is running on this bundle (pid {pid}) — wait for it to finish "
                             "(tail -f results/logs/run.log) or stop it, then rerun ./run.sh") from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def check_files(bundle: Path, manifest: dict) -> None:
    """Refuse a bundle whose manifest or any file it lists changed since it was made."""
    problem = bundle_problem(bundle, manifest)
    if problem:
        raise BundleRunError(f"{problem} (modified after it was made) — unpack the bundle again")


def loaded_modules(bundle: Path) -> dict:
    """Every opscan/op_probes module loaded in this process, with its file relative to the bundle."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if name.split(".")[0] in ("opscan", "op_probes") and getattr(module, "__file__", None):
            path = Path(module.__file__).resolve()
            out[name] = str(path.relative_to(bundle)) if path.is_relative_to(bundle) else str(path)
    return out


def host_files(bundle: Path) -> dict:
    """The environment run.sh recorded (results/env/*.txt), by name."""
    folder = bundle / "results" / "env"
    return {p.stem: p.read_text(errors="replace")[-OUTPUT_LIMIT:] for p in sorted(folder.glob("*.txt"))}


def run_repro(bundle: Path, script: str, timeout: float, environment: dict | None, probe: str | None = None) -> dict:
    """Run one repro script with a limit; its output (stdout and stderr), exit code and call's probe id."""
    env = {k: v for k, v in os.environ.items() if k not in (FALLBACK_VAR, "PYTHONPATH")}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, script], cwd=bundle, env=env, stdin=subprocess.DEVNULL,  # noqa: S603 - this interpreter runs the bundle's own repro script, listed in its checked manifest
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, code = proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, code = proc.communicate()[0] + f"\n[opscan: killed after {timeout:g} s]\n".encode(), None
    text = output.decode(errors="replace")[-OUTPUT_LIMIT:]
    return {"kind": "repro", "script": script, "probe": probe, "exit_code": code, "output": text,
            "duration": round(time.monotonic() - start, 3), "device": environment and environment.get("device"),
            "environment": environment}


def check_device(device: str) -> None:
    """Refuse, before writing any result, a device this machine cannot probe on (a bundle for MPS run off a Mac
    would otherwise record every probe's failure as an outcome)."""
    try:
        import torch
    except ImportError as exc:
        raise BundleRunError(f"{sys.executable} cannot import torch ({exc}) — pip install torch, or set "
                             "PYTHON=/path/to/python") from None
    usable = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not usable.get(device, False):
        hint = ("a Mac with Apple Silicon and a torch built for MPS (macOS 14 or newer from torch 2.9)"
                if device == "mps" else f"a machine where torch {torch.__version__} can use {device}")
        raise BundleRunError(f"this bundle probes on {device}, which torch {torch.__version__} cannot use here — "
                             f"run it on {hint}")


def header(manifest: dict, options: RunnerOptions) -> dict:
    """The results header: the bundle hash and plan fingerprint it belongs to, and how probes ran."""
    return {"results": VERSION, "bundle": manifest["bundle_hash"], "fingerprint": manifest["fingerprint"],
            "device": manifest["device"], "probes": manifest["probes"], "opscan_version": __version__,
            "workers": options.workers, "timeout_s": options.timeout, "on_pass": options.on_pass,
            "isolation": isolation_for(options)}


def run(bundle: Path, workers: int | None, double=None) -> int:
    """Probe, run the repro scripts, write the end line; 0 when the results are complete. `double`
    (probe.backends.DeviceDouble, tests only: run.sh never passes one) stands in for the bundle's device."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    check_files(bundle, manifest)
    if double is None:
        check_device(manifest["device"])
    probes = [ProbeCall.from_dict(json.loads(line)) for line in (bundle / PROBES).read_text().splitlines() if line]
    spec = manifest["runner"]
    options = RunnerOptions(device=manifest["device"], workers=workers or spec["workers"] or min(4, os.cpu_count()
                            or 1), timeout=spec["timeout"], on_pass=spec["on_pass"],
                            log_path=str(bundle / "results" / "logs" / "workers.log"), double=double)
    writer = ResultsWriter(bundle / RESULTS, header(manifest, options))
    if writer.complete:
        print(f"opscan bundle: {RESULTS} is already complete — copy it back and run `opscan merge`", file=sys.stderr)
        return 0
    writer.write({"kind": "runner", "python": sys.executable, "resumed": len(writer.done),
                  "modules": loaded_modules(bundle)})
    if writer.fresh:
        writer.write({"kind": "host", "files": host_files(bundle)})
    result = run_probes(probes, options, writer.done, writer, writer.environments)
    environment = result.environments.get("off")
    for entry in manifest.get("repro", []):
        if entry["script"] not in writer.repro:
            print(f"opscan bundle: running {entry['script']}", file=sys.stderr, flush=True)
            writer.write(run_repro(bundle, entry["script"], manifest.get("repro_timeout", 120), environment,
                                   entry["probe"]))
    writer.finish({"probes": len(probes), "off": len(result.off), "on": len(result.on), "reused": result.reused,
                   "repro": len(manifest.get("repro", []))})
    print(f"opscan bundle: done — {RESULTS} is complete; copy it back and run `opscan merge`", file=sys.stderr)
    return 0


def preflight(bundle: Path) -> str:
    """run.sh's first check, before it writes anything: the files match the manifest, torch imports and can use
    the bundle's device, and no other run holds the lock. What to record of Python and torch."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    check_files(bundle, manifest)
    check_device(manifest["device"])
    if (bundle / "results" / ".lock").exists():
        hold_lock(bundle / "results").close()
    import torch

    return (f"{sys.version}\ntorch {torch.__version__} {torch.version.git_version} mps "
            f"{torch.backends.mps.is_available()}")


def main(argv: list[str] | None = None) -> int:
    """Entry point (run.sh)."""
    parser = argparse.ArgumentParser(prog="python -m opscan.bundle.remote")
    parser.add_argument("bundle", help="the bundle folder (holds manifest.json)")
    parser.add_argument("--workers", type=int, help="probe processes per pass (default: the bundle's, else min(4, "
                                                    "cores))")
    parser.add_argument("--check", action="store_true", help="only check that the bundle can run here (run.sh's "
                        "first step); print the Python and torch versions")
    ns = parser.parse_args(argv)
    try:
        if ns.check:
            print(preflight(Path(ns.bundle).resolve()))
            return 0
        return run(Path(ns.bundle).resolve(), ns.workers)
    except OpscanError as exc:
        print(f"opscan bundle: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # an unreadable or broken manifest.json
        print(f"opscan bundle: error: cannot read {ns.bundle}/{MANIFEST} ({exc}) — unpack the bundle again",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
