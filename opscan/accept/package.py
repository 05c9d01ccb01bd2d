"""Accept stage (package): the acceptance package as data — relative path -> text or bytes. Pure.

Only opscan/cli/accept.py writes it. What a second person needs to judge and rerun the acceptance:
environment.json, spec.yaml, logs/accept.log, comparison.json, comparison.md, memory.json,
fallbacks.json, transfers.json, placement.json, checkpoint/checkpoint.pt (the only binary: load it with
torch.load(..., weights_only=True)), verdict.json, RERUN.md and rerun.sh.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from opscan.accept.render import comparison_markdown, kind_rows
from opscan.target.inputs import REDACTED, arg_words
from opscan.trust.text import strict_json

CHECKPOINT = "checkpoint/checkpoint.pt"


def build_package(result, environment: dict[str, Any], log_text: str, cwd: str) -> dict[str, str | bytes]:
    """Every file of the package, by its path relative to the package folder."""
    placement = result.target_run.placement
    files = {
        "environment.json": _json(environment),
        "spec.yaml": spec_yaml(result),
        "logs/accept.log": log_text,
        "comparison.json": _json(comparison_data(result)),
        "comparison.md": comparison_markdown(result),
        "memory.json": _json({"target": list(placement.memory),
                              "reference": list(result.reference_run.placement.memory)}),
        "fallbacks.json": _json([f.to_dict() if hasattr(f, "to_dict") else _fallback(f) for f in placement.fallbacks]),
        "transfers.json": _json([t.to_dict() for t in placement.transfers]),
        "placement.json": _json({"target": placement.to_dict(),
                                 "reference": result.reference_run.placement.to_dict()}),
        CHECKPOINT: result.checkpoint,
        "verdict.json": _json(verdict_data(result)),
        "RERUN.md": rerun_markdown(result, cwd),
        "rerun.sh": rerun_script(result, cwd),
    }
    if not result.checkpoint:  # the target run stopped before it saved one
        files.pop(CHECKPOINT)
    return files


def spec_yaml(result) -> str:
    """The effective spec (readable back with --spec) and the run's choices."""
    data = result.options.spec.to_dict()
    data.pop("source")
    data["choices"] = {k: v for k, v in result.choices.items() if v is not None}
    head = (f"# opscan accept spec, effective for {result.options.target} (tolerances from "
            f"{result.options.spec.source}); reusable with --spec. `choices` is a record, not read back.\n")
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)


def comparison_data(result) -> dict[str, Any]:
    """comparison.json: every comparison, the per-kind table, the first divergences."""
    first, trip = result.first_divergence, result.round_trip_failure
    return {"first_divergence": first.to_dict() if first else None,
            "round_trip_failure": trip.to_dict() if trip else None,
            "kinds": [_finite(r) for r in kind_rows((*result.comparisons, *result.round_trip))],
            "losses": {"target": _losses(result.target_run), "reference": _losses(result.reference_run)},
            "comparisons": [c.to_dict() for c in result.comparisons],
            "round_trip": [c.to_dict() for c in result.round_trip]}


def verdict_data(result) -> dict[str, Any]:
    """verdict.json: accepted or not, the measured lane and its reasons, the predicted lane, the exit code."""
    return {"accepted": result.exit_code == 0, "exit_code": result.exit_code,
            "comparisons_within_tolerance": result.first_divergence is None,
            "round_trip_ok": result.round_trip_failure is None if result.round_trip else None,
            "target_failure": result.target_failure or None, "failures": list(result.failures),
            "lane": result.lane.to_dict(), "measured_on": result.options.device, "predicted": result.predicted,
            "fail_on_lane": result.options.fail_on_lane, "model": result.options.target,
            "model_name": result.model_name, "step_bytes": result.step_bytes}


def command(result, spec_path: str, output: str) -> list[str]:
    """The command line that reruns this acceptance with the package's spec."""
    o = result.options
    argv = ["python", "-m", "opscan", "accept", o.target, "--device", o.device, "--reference", o.reference]
    argv += arg_words(o.args, o.public_args)  # KEY=<redacted> unless --public-arg KEY: rerun.sh asks for it
    argv += [a for text in o.inputs for a in ("--input", text)]
    argv += ["--dtype", o.dtype] if o.dtype != "float32" else []
    argv += ["--allow-tf32"] if o.allow_tf32 else []
    argv += ["--perturb", f"{o.perturb[0]}={o.perturb[1]!r}"] if o.perturb else []
    argv += ["--fail-on-lane", o.fail_on_lane, "--spec", spec_path, "-o", output]
    return argv


def rerun_markdown(result, cwd: str) -> str:
    """RERUN.md: how to reproduce, from the folder the run started in."""
    line = shlex.join(command(result, "PACKAGE/spec.yaml", "PACKAGE-rerun"))
    return (f"# Rerun this acceptance\n\nFrom `{cwd}` (the folder the run started in; TARGET paths are relative "
            f"to it), with the same packages (environment.json):\n\n```sh\n{line}\n```\n\nwhere PACKAGE is this "
            "folder. Or run `bash rerun.sh` (it changes to that folder first; set OPSCAN_RERUN_CWD to run "
            f"elsewhere). An --arg shown as `KEY={REDACTED}` was not recorded (a value may be a credential; "
            "`--public-arg KEY` records it): rerun.sh reads it from the variable OPSCAN_ARG_KEY. The checkpoint "
            "loads with `torch.load('checkpoint/checkpoint.pt', weights_only=True)`: "
            "`{'model': state_dict, 'optimizer': state_dict}`.\n")


def rerun_script(result, cwd: str) -> str:
    """rerun.sh: the exact command, with this package's spec. Every value from the run (the folder, each
    argument) is shlex-quoted: a path with spaces, `$`, `}` or backticks stays inert text."""
    spec, out = object(), object()  # placeholders, swapped for the package's paths element by element
    shell = {spec: '"$PACKAGE/spec.yaml"', out: '"$PACKAGE-rerun"'}
    argv = command(result, spec, out)
    line = " ".join(['"${PYTHON:-python3}"', *(shell.get(a) or _from_environment(a) or shlex.quote(a)
                                               for a in argv[1:])])
    return ("#!/usr/bin/env bash\n# Rerun the acceptance this package records (exit code as opscan accept's; "
            "PYTHON picks the interpreter).\n"
            'set -euo pipefail\nPACKAGE="$(cd "$(dirname "$0")" && pwd)"\n'
            f"CWD={shlex.quote(cwd)}\n"
            'cd "${OPSCAN_RERUN_CWD:-$CWD}"\nexport HF_HUB_OFFLINE=1\n' f"{line}\n")


def _from_environment(word) -> str | None:
    """`KEY=<redacted>` (an --arg whose value is not recorded) as the shell word that reads it from OPSCAN_ARG_KEY
    and stops with a line naming the variable when it is not set; None for any other word."""
    key, sep, value = str(word).partition("=")
    if not sep or value != REDACTED or not key.isidentifier():
        return None
    return f'"{key}=${{OPSCAN_ARG_{key}:?set OPSCAN_ARG_{key} to the value of --arg {key}, which is not recorded}}"'


def _losses(run) -> list[float]:
    return [float(c.tensor.float().item()) for c in run.captured if c.kind == "loss"]


def _fallback(f) -> dict[str, Any]:
    return {"op": f.op, "count": f.count, "modules": list(f.modules), "phases": list(f.phases),
            "evidence": f.evidence, "bytes": getattr(f, "bytes", 0)}


def _finite(row: dict) -> dict:
    return {k: (str(v) if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")) else v)
            for k, v in row.items()}


def _json(data: Any) -> str:
    return strict_json(data, indent=2, default=str) + "\n"
