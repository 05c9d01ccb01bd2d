"""Cell-by-cell diff of two zoo leaderboards, each changed cell grouped by its cause (docs/leaderboard/CHANGES.md).

`opscan zoo diff` lists the cells whose *lane* changed. Re-publishing a board from another torch and another
opscan also changes cells whose lane stays (a blocking row gone while another stays), so this compares every
model x release in both boards on its lane **and** its blocking rows (op, dtypes, verdict, rule), and says why each
changed: every blocking row that appeared or disappeared must be claimed by one of CAUSES (a release range and
the ops its release-faithful path removes or adds, with the source the cause rests on). A changed cell that some
cause does not fully explain is listed under `unexplained` — a bug to investigate, never a silent pass. A cell
whose lane changed with no change in its blocking rows is unexplained too.

    python tools/board_changes.py OLD NEW [--models NAME,...] [-f markdown|json] [--title T]

OLD and NEW: a leaderboard.json (schema opscan-zoo/1), a leaderboard.csv / .csv.gz (`opscan zoo`'s CSV; the
old timm-full board is kept only as CSV) or a run's zoo.jsonl journal (the models finished so far).
`--models`: only models also in this list (or in NEW with --models=new). Read with json/csv only (the boards
are files opscan did not write in this run). Exit 0 when every changed cell is explained, 1 when some is not,
2 for a file that is not a board.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROW = re.compile(r"^(?P<op>[^\[]+)\[(?P<dtypes>[^\]]*)\] (?P<verdict>\S+) \((?P<rule>[^)]*)\)$")


@dataclass(frozen=True)
class Cause:
    """Why cells change: in `series` (release prefixes; () every release) blocking rows on `gone` ops disappear
    (a release-faithful path), or rows of a verdict in `appears` are new (knowledge opscan gained)."""

    key: str
    title: str
    series: tuple[str, ...]
    gone: tuple[str, ...]
    evidence: str
    appears: tuple[str, ...] = ()
    new_ops: tuple[str, ...] = ()  # ops whose appearing rows this cause claims, whatever their verdict

    def _in(self, release: str) -> bool:
        return not self.series or release.rsplit(".", 1)[0] in self.series

    def claims(self, release: str, op: str) -> bool:
        return self._in(release) and op in self.gone

    def adds(self, release: str, verdict: str, rule: str) -> bool:
        return self._in(release) and (verdict in self.appears or f"{verdict} ({rule})" in self.appears)

    def adds_op(self, release: str, op: str) -> bool:
        return self._in(release) and op in self.new_ops


CAUSES = (
    Cause("lerp_", "AdamW's `lerp_` (torch 2.0.x)", ("2.0",), ("aten::lerp_.Scalar",),
          "torch 2.0.0/2.0.1 wheels, torch/optim/adamw.py:389 `exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)` "
          "(lerp_ from 2.1.0, pytorch/pytorch PR #104796); opscan/knowledge/facts.yaml earlier_paths "
          "`torch/optim/adam.py:_single_tensor_adam` lerp_.Scalar -> mul_.Tensor + add_.Tensor (rule earlier-path); "
          "aten::lerp_.Scalar has no MPS kernel before 2.1.0 (`opscan coverage --torch-version 2.0.0 --op lerp_`)"),
    Cause("isneginf", "`_safe_softmax`'s `isneginf` (torch 2.5.x)", ("2.5",), ("aten::isneginf",),
          "libtorch_cpu.dylib of the 2.5.0/2.5.1 wheels: opscan/knowledge/composite_callees.txt "
          "`_safe_softmax CEA 2.5.0..2.5.1 all.dim eq.Tensor scalar_tensor softmax.int where.self` "
          "(2.6.0..2.14.1: `isneginf`, an MPS kernel only from 2.6.0); rule release-callees "
          "(opscan/predict/release_paths.py)"),
    Cause("log_sigmoid", "BCE-with-logits' `log_sigmoid` (torch 2.0.x)", ("2.0",),
          ("aten::log_sigmoid_forward", "aten::log_sigmoid_backward"),
          "libtorch_cpu.dylib of the 2.0.0..2.2.2 wheels: composite_callees.txt `binary_cross_entropy_with_logits "
          "CEA 2.0.0..2.2.2 ... clamp_min_ exp_ log_ neg ...` (no log_sigmoid; 2.3.0..2.14.1 call log_sigmoid); "
          "log_sigmoid_forward has an MPS kernel from 2.1.0, so only 2.0.x cells change; rule release-callees"),
    Cause("__rpow__", "`Tensor.__rpow__`'s `pow.Scalar` (torch 2.0.x)", ("2.0",), ("aten::pow.Scalar",),
          "torch 2.0.0/2.0.1 wheels torch/_tensor.py:878 `torch.tensor(other, dtype=dtype, device=self.device) ** "
          "self` (pow.Tensor_Tensor, native); facts.yaml earlier_paths `torch/_tensor.py:Tensor.__rpow__` "
          "pow.Scalar -> lift_fresh + pow.Tensor_Tensor; pow.Scalar has no MPS kernel before 2.1.0"),
    Cause("norm", "`torch.norm`'s MPS branch (`_VF.norm`, every release)", ("2.0",),
          ("aten::linalg_vector_norm",),
          "torch/functional.py:norm in every wheel 2.0.0-2.14.1 calls torch.linalg.vector_norm only for "
          "cpu/cuda/meta devices and `_VF.norm` (aten::norm.ScalarOpt_dim, MPS kernel in 2.0.0) on MPS; "
          "opscan/trace/branches.py (device-branch audit) and facts.yaml earlier_paths "
          "`torch/nn/utils/clip_grad.py:_get_total_norm`; linalg_vector_norm always runs on the CPU in 2.0.x"),
    Cause("amp-api", "`torch.autocast(\"mps\")` raises before 2.5.0 (finding `torch::autocast.mps`)",
          ("2.0", "2.1", "2.2", "2.3", "2.4"), (),
          "torch 2.0.0 wheel torch/amp/autocast_mode.py:201 (`raise RuntimeError('User specified autocast device_type "
          "must be 'cuda' or 'cpu'')`, before `enabled` is looked at) and 2.4.0's :238 (`if not "
          "is_autocast_available(self.device): raise RuntimeError(...)`); opscan/trace/amp.py (issue 24, after the "
          "old boards): a step entering autocast for mps, even with enabled=False (timm's EfficientViT attention), "
          "is an `error` row (rule amp-api) on 2.0-2.4", appears=("error (amp-api)",)),
    Cause("missing-api", "a torch function the release's wheel does not have (rule `missing-api`)", (), (),
          "opscan/knowledge/py_drift.txt (each release's wheel): the function the step's code calls is absent; "
          "each API is checked by hand in CHANGES.md", appears=("error (missing-api)",)),
    Cause("timm-version", "the model's own code in timm 1.0.31 (the old host had another timm)", (),
          ("aten::_upsample_bicubic2d_aa", "aten::_upsample_bicubic2d_aa_backward"),
          "timm 1.0.31 timm/models/naflexvit.py:2491 `naflexvit_base_patch16_siglip`: "
          "`pos_embed_interp_mode='bilinear'` (the NaFlexVitCfg default, line 100, is 'bicubic', which the old "
          "host's timm used): its position embedding is resized by _upsample_bilinear2d_aa, not bicubic",
          new_ops=("aten::_upsample_bilinear2d_aa", "aten::_upsample_bilinear2d_aa_backward")),
    Cause("silent", "a known MPS silent-correctness bug (verdict `mismatch`)", (), (),
          "opscan/knowledge/silent_bugs.yaml (issue 26, after the old boards): a call that meets an entry's "
          "condition in an affected release is predicted `mismatch` (rule silent-bug-<id>, the pytorch issue and "
          "fix PR in the row's source); the old boards had no such verdict", appears=("mismatch",)),
)


@dataclass(frozen=True)
class CellState:
    lane: str
    rows: frozenset[tuple[str, str, str, str]]  # (op, dtypes, verdict, rule)


def _rows_of_text(text: str) -> frozenset[tuple[str, str, str, str]]:
    rows = set()
    for part in filter(None, (p.strip() for p in text.split("; "))):
        m = ROW.match(part)
        if m is None:
            raise ValueError(f"not a blocking row: {part!r}")
        rows.add((m["op"], m["dtypes"], m["verdict"], m["rule"]))
    return frozenset(rows)


def _read_csv(text: str) -> dict[tuple[str, str], CellState]:
    cells = {}
    for r in csv.DictReader(io.StringIO(text)):
        if r["status"] == "error":
            cells[(r["model"], "*")] = CellState("error", frozenset({("error", "", r["error"], "")}))
        else:
            cells[(r["model"], r["release"])] = CellState(r["lane"], _rows_of_text(r["blocking"]))
    return cells


def _read_json(data: dict) -> dict[tuple[str, str], CellState]:
    if data.get("schema") != "opscan-zoo/1":
        raise ValueError("not an opscan-zoo/1 leaderboard")
    cells = {}
    for m in data["models"]:
        name = m["model"]["name"]
        if m.get("error"):
            cells[(name, "*")] = CellState("error", frozenset({("error", "", m["error"], "")}))
        for c in m.get("cells", []):
            rows = frozenset((b["op"], ",".join(b["dtypes"]), b["verdict"], b["rule"]) for b in c["blocking"])
            cells[(name, c["release"])] = CellState(c["lane"], rows)
    return cells


def read_board(path: Path) -> dict[tuple[str, str], CellState]:
    """{(model, release): CellState}; an error model is one cell keyed (model, "*")."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode("utf-8")
    if path.name.endswith(".jsonl"):  # a zoo journal (a run in progress): its finished models
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        models = [x["result"] for x in lines if x.get("kind") == "model"]
        return _read_json({"schema": "opscan-zoo/1", "models": models})
    return _read_json(json.loads(text)) if path.name.endswith(".json") else _read_csv(text)


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".")) if release != "*" else (999,)


def classify(release: str, gone: set, new: set) -> tuple[tuple[str, ...], tuple]:
    """The causes that claim the cell's changed rows, and the rows no cause claims."""
    keys, left = [], []
    for row in sorted(gone):
        cause = next((c for c in CAUSES if c.claims(release, row[0])), None)
        if cause is None:
            left.append(("-",) + row)
        elif cause.key not in keys:
            keys.append(cause.key)
    for row in sorted(new):
        cause = next((c for c in CAUSES if c.adds(release, row[2], row[3]) or c.adds_op(release, row[0])), None)
        if cause is None:
            left.append(("+",) + row)
        elif cause.key not in keys:
            keys.append(cause.key)
    return tuple(keys), tuple(left)


def compare(old: dict, new: dict, models: set | None = None) -> dict:
    """Every common model x release: unchanged, or changed with its causes and unexplained rows."""
    names = {m for m, _ in old} & {m for m, _ in new}
    if models is not None:
        names &= models
    changes, unchanged, keys = [], 0, sorted({k for k in old if k[0] in names} & {k for k in new if k[0] in names})
    for key in keys:
        a, b = old[key], new[key]
        if a == b:
            unchanged += 1
            continue
        causes, left = classify(key[1], set(a.rows - b.rows), set(b.rows - a.rows))
        if a.lane != b.lane and not (a.rows ^ b.rows):
            left += (("lane", a.lane, b.lane, ""),)
        changes.append({"model": key[0], "release": key[1], "old_lane": a.lane, "new_lane": b.lane,
                        "gone": sorted(a.rows - b.rows), "new": sorted(b.rows - a.rows), "causes": list(causes),
                        "unexplained": [list(r) for r in left]})
    only = sorted({m for m, _ in old} ^ {m for m, _ in new})
    return {"models": len(names), "cells": len(keys), "unchanged": unchanged, "changes": changes,
            "errors_only_one_side": [k for k in set(old) ^ set(new) if k[1] == "*" and k[0] in names],
            "models_only_in_one": only if models is None else sorted(set(only) & models)}


def _table(header: tuple, rows: list) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]


def render_markdown(found: dict, title: str) -> str:
    ch = found["changes"]
    lane = [c for c in ch if c["old_lane"] != c["new_lane"]]
    lines = [f"### {title}", "", f"{found['models']} models in both boards, {found['cells']} cells compared: "
             f"{len(ch)} changed ({len(lane)} changed lane, {len(ch) - len(lane)} only their blocking rows), "
             f"{found['unchanged']} unchanged.", ""]
    by_cause = Counter("+".join(c["causes"]) or "(none)" for c in ch if not c["unexplained"])
    by_cause.update("unexplained" for c in ch if c["unexplained"])
    lines += _table(("cause", "cells", "lane changed"), [
        (k, n, sum(1 for c in lane if ("+".join(c["causes"]) or "(none)") == k and not c["unexplained"])
         if k != "unexplained" else sum(1 for c in lane if c["unexplained"])) for k, n in by_cause.most_common()])
    releases = sorted({c["release"] for c in ch}, key=_release_key)
    per = Counter((c["release"], "+".join(c["causes"]) if not c["unexplained"] else "unexplained") for c in ch)
    cols = sorted({k for _, k in per})
    lines += ["", "Per release (cells):", ""] + _table(("release", *cols), [
        (r, *(per[(r, k)] or "" for k in cols)) for r in releases])
    moves = Counter((c["release"], c["old_lane"], c["new_lane"]) for c in lane)
    lines += ["", "Lane changes:", ""] + _table(("release", "old lane", "new lane", "cells"), [
        (r, a, b, n) for (r, a, b), n in sorted(moves.items(), key=lambda x: (_release_key(x[0][0]), x[0][1:]))])
    bad = [c for c in ch if c["unexplained"]]
    if bad:
        lines += ["", f"Unexplained cells ({len(bad)}):", ""]
        lines += [f"- {c['model']} @ {c['release']}: {c['old_lane']} -> {c['new_lane']}; "
                  + "; ".join(" ".join(str(x) for x in r if x) for r in c["unexplained"]) for c in bad]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--models", help="comma-separated model names, or `new`: the models of NEW")
    parser.add_argument("-f", "--format", choices=("markdown", "json"), default="markdown")
    parser.add_argument("--title", default="Cells changed")
    args = parser.parse_args(argv)
    try:
        old, new = read_board(args.old), read_board(args.new)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"board_changes: {exc}: give two leaderboard.json or leaderboard.csv[.gz] files", file=sys.stderr)
        return 2
    models = None if not args.models else (
        {m for m, _ in new} if args.models == "new" else set(args.models.split(",")))
    found = compare(old, new, models)
    sys.stdout.write(json.dumps(found, indent=1) + "\n" if args.format == "json"
                     else render_markdown(found, args.title))
    return 1 if any(c["unexplained"] for c in found["changes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
