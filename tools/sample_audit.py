#!/usr/bin/env python3
"""Audit leaderboard cells against the release's own code: for each sampled cell (model x release) install that
torch release from PyPI in a throwaway venv, run the model's training step under a dispatch recorder, and compare
the aten ops it really dispatched with the rows opscan predicts for that release (issue 38).

    python tools/sample_audit.py docs/leaderboard/torchvision/leaderboard.json --cell mobilenet_v3_small@2.0.0
    python tools/sample_audit.py BOARD.json --cells 2 --seed 0 --work /tmp/opscan-audit

What PyPI serves: for Linux x86_64 every torch 2.x release is a CUDA build (torch-R-cp311-cp311-manylinux*_x86_64,
with its nvidia-* wheels as dependencies; the CPU-only wheels are on PyTorch's own index, which this machine cannot
reach). A CUDA build runs on a machine without a GPU: the step runs on the CPU, the CPU kernels and the release's own
Python (optimizers, F.*, the C++ composites) decide what dispatches — what a Mac on that release traces before its
MPS-specific device branches. The venv also gets the model's library (torchvision: the one pip pairs with torch==R;
timm: the board's version) and numpy<2 before torch 2.3. One venv per release, kept in --work for reuse.

The step is opscan's own (opscan/trace/step.py: forward, the default loss, backward, AdamW step and zero_grad) on
the board's model factory (opscan/zoo/factories.py), imported from this checkout in the venv; the recorder is a
TorchDispatchMode counting each OpOverload. opscan's side is a `--torch-version R` scan of the same model on the
installed torch (real tensors, as the audit). Per cell it prints: ops the release dispatched that no row of opscan's
names (by its op or the CPU op an MPS branch replaced), rows whose op the release never dispatched (with their rule:
MPS-only branches and release-drift rows are expected there), and whether each of the board's blocking rows was
dispatched. Exit codes: 0 audited (differences are data, printed), 2 usage or install error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess  # noqa: S404 - runs pip and the venv's python on arguments this tool builds
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import collections, importlib, importlib.util, json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# opscan/trace/step.py by path: the opscan.trace package itself needs the installed torch's newest APIs
_spec = importlib.util.spec_from_file_location("audit_step", sys.argv[2])
_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_step)
call_model, default_loss, make_optimizer = _step.call_model, _step.default_loss, _step.make_optimizer
import torch._subclasses.fake_tensor as _fake
if not hasattr(_fake, "is_fake"):  # older releases: factories.fake_safe_init asks it; every tensor here is real
    _fake.is_fake = lambda tensor: False

spec = json.loads(sys.argv[1])
module, _, name = spec["target"].partition(":")
model, inputs = getattr(importlib.import_module(module), name)(**spec["args"])
model.train()
optimizer = make_optimizer(model)
ops = collections.Counter()

class Recorder(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        schema = func._schema
        over = func._overloadname
        ops[schema.name + ("" if over == "default" else "." + over)] += 1
        return func(*args, **(kwargs or {}))

with Recorder():
    outputs = call_model(model, inputs)
    default_loss(outputs, inputs).backward()
    optimizer.step()
    optimizer.zero_grad()
print("AUDIT " + json.dumps({"torch": torch.__version__, "ops": dict(ops)}))
'''


def pick_cells(board: dict, cells: list[str], count: int, seed: int) -> list[tuple[dict, str]]:
    """(model entry, release) for each `MODEL@RELEASE`, else `count` random cells of models scanned without error."""
    models = {m["model"]["name"]: m for m in board["models"]}
    if cells:
        out = []
        for cell in cells:
            name, _, release = cell.partition("@")
            if name not in models or release not in board["releases"]:
                raise SystemExit(f"sample_audit: {cell} is not a cell of the board (MODEL@RELEASE)")
            out.append((models[name], release))
        return out
    pool = [(m, c["release"]) for m in board["models"] if not m.get("error") for c in m["cells"]]
    return random.Random(seed).sample(pool, min(count, len(pool)))


def ensure_venv(work: Path, release: str, library: str) -> Path:
    """A venv with torch==release and the model's library; its python."""
    folder = work / f"venv-{release}-{library}"
    python = folder / "bin" / "python"
    if (folder / "ready").is_file():
        return python
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    extra = {"torchvision": ["torchvision"], "timm": ["timm==" + _version("timm")]}.get(library, [])
    numpy = ["numpy<2"] if tuple(int(x) for x in release.split(".")[:2]) < (2, 3) else []
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    cmd = [str(python), "-m", "pip", "install", "--quiet", f"torch=={release}", *extra, *numpy, "pyyaml"]
    if subprocess.run(cmd, env=env, check=False).returncode != 0:  # noqa: S603 - pip with arguments built here
        raise SystemExit(f"sample_audit: pip could not install torch=={release} {' '.join(extra)} from PyPI")
    (folder / "ready").write_text(release + "\n", encoding="utf-8")
    return python


def _version(dist: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(dist)


def record(python: Path, model: dict) -> dict:
    """The ops the release dispatched for the model's step (run in the release's venv)."""
    spec = json.dumps({"target": model["model"]["target"], "args": model["model"].get("args") or {}})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    step = str(ROOT / "opscan" / "trace" / "step.py")
    done = subprocess.run([str(python), "-c", CHILD, spec, step], env=env, capture_output=True, text=True,  # noqa: S603
                          check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("AUDIT ")), None)
    if line is None:
        raise SystemExit(f"sample_audit: the step failed on the release's torch: {done.stderr.strip()[-600:]}")
    return json.loads(line[6:])


def predicted(model: dict, release: str):
    """opscan's report for the model at `release` (real tensors, as the audit's run)."""
    from opscan.scan import ScanOptions, scan
    from opscan.zoo.models import ZooModel

    zoo = ZooModel.from_dict(model["model"])
    return scan(ScanOptions(zoo.target, args=dict(zoo.args), inputs=zoo.inputs, torch_version=release, fake=False,
                            auto_fake=False, memory=False, fx=False))


def compare(real: dict, report, cell: dict) -> dict:
    """What differs between the release's dispatched ops and opscan's rows (and the board's blocking rows)."""
    # profiler:: ops are record_function markers (optimizer.step's), not kernels
    dispatched = {op for op in real["ops"] if not op.startswith("profiler::")}
    named = {}
    for row in report.rows:
        named.setdefault(row.op.display, row.evidence.rule)
        if row.cpu_op is not None:
            named.setdefault(row.cpu_op.display, row.evidence.rule)
    rows_not_run = sorted((r.op.display, r.evidence.rule) for r in report.rows if r.op.display not in dispatched
                          and (r.cpu_op is None or r.cpu_op.display not in dispatched))
    blocking = {b["op"]: b["op"] in dispatched or any(r.op.display == b["op"] and r.cpu_op is not None and
                                                       r.cpu_op.display in dispatched for r in report.rows)
                for b in cell["blocking"]}
    return {"torch": real["torch"], "dispatched": len(dispatched), "rows": len(report.rows),
            "lane": report.lane.name.value, "board_lane": cell["lane"],
            "dispatched_not_in_rows": sorted(op for op in dispatched if op not in named),
            "rows_not_dispatched": rows_not_run, "board_blocking_dispatched": blocking}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("board", type=Path, help="a leaderboard.json")
    parser.add_argument("--cell", action="append", default=[], help="MODEL@RELEASE (repeatable)")
    parser.add_argument("--cells", type=int, default=1, help="random cells to audit without --cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/opscan-audit"), help="venvs and results")
    args = parser.parse_args(argv)
    board = json.loads(args.board.read_text(encoding="utf-8"))
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for model, release in pick_cells(board, args.cell, args.cells, args.seed):
        library = "timm" if "timm" in model["model"]["target"] else "torchvision"
        python = ensure_venv(args.work, release, library)
        real = record(python, model)
        cell = next(c for c in model["cells"] if c["release"] == release)
        found = {"cell": f"{model['model']['name']}@{release}", **compare(real, predicted(model, release), cell)}
        results.append(found)
        print(json.dumps(found, indent=1))
    (args.work / "audit.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    same = sum(not r["dispatched_not_in_rows"] for r in results)
    print(f"sample_audit: {len(results)} cells, {same} with every dispatched op named by a row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
