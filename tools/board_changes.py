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


S20_22 = ("2.0", "2.1", "2.2")
S20_23 = S20_22 + ("2.3",)
S20_24 = S20_23 + ("2.4",)
S25_28 = ("2.5", "2.6", "2.7", "2.8")
S23_28 = ("2.3", "2.4") + S25_28
S21_28 = ("2.1", "2.2") + S23_28
# kernel_rules.yaml fallbacks of 2.0-2.4 below macOS 13 added after the 2026-12-03 boards (30b3205, 56d5e46)
FALLBACKS_MACOS_13 = ("upsample-nearest-macos-13", "upsample-bilinear2d-scale-macos-13",
                      "upsample-bilinear2d-backward-scale-macos-13", "nonzero-macos-13", "median-macos-13",
                      "randperm-macos-13", "unique-macos-13", "unique-consecutive-macos-13",
                      "unique-dim-consecutive-macos-13")
FALLBACKS_ISSUE_38 = ("sort-macos-13", "topk-k16-macos-13")  # d2dc324, same releases
SILENT_ISSUE_34 = ("114692",)  # silent_bugs.yaml entries issue 34 added that the re-scanned boards meet
SILENT_ISSUE_26 = ("110120", "133520", "140902", "180984", "187117")  # the entries the 2026-12-03 boards met


@dataclass(frozen=True)
class Cause:
    """Why cells change: in `series` (release prefixes; () every release) blocking rows on `gone` ops, or rows
    spelled in `gone_rows`, disappear (a release-faithful path, a false row fixed), or rows of a verdict in `appears`
    are new (knowledge opscan gained). `appears` and `gone_rows` spell a row as "verdict", "verdict (rule)" or
    "op verdict (rule)"; a cause with several release ranges is several Causes of one key."""

    key: str
    title: str
    series: tuple[str, ...]
    gone: tuple[str, ...]
    evidence: str
    appears: tuple[str, ...] = ()
    new_ops: tuple[str, ...] = ()  # ops whose appearing rows this cause claims, whatever their verdict
    gone_rows: tuple[str, ...] = ()

    def _in(self, release: str) -> bool:
        return not self.series or release.rsplit(".", 1)[0] in self.series

    def claims(self, release: str, op: str, verdict: str = "", rule: str = "") -> bool:
        return self._in(release) and (op in self.gone or _spelled(self.gone_rows, op, verdict, rule))

    def adds(self, release: str, verdict: str, rule: str, op: str = "") -> bool:
        return self._in(release) and _spelled(self.appears, op, verdict, rule)

    def adds_op(self, release: str, op: str) -> bool:
        return self._in(release) and op in self.new_ops


def _spelled(spellings: tuple[str, ...], op: str, verdict: str, rule: str) -> bool:
    return verdict in spellings or f"{verdict} ({rule})" in spellings or f"{op} {verdict} ({rule})" in spellings


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
    # issue 38's re-scan (2026-12-07): what main fixed after the 2026-12-03 boards (made at 9874fce/585cc8a)
    Cause("conv3d", "Conv3D refused by the MPS kernel (torch 2.0.0-2.2.2)", S20_22, (),
          "opscan/knowledge/kernel_rules.yaml rule `conv3d` (commit 04f1eb2, issue 38): kernel_checks.txt kc-672882ca, "
          "Convolution.mm:77 `TORCH_CHECK(input_t.dim() < 5, \"Conv3D is not supported on MPS\")` in the 2.0.0-2.2.2 "
          "libtorch_cpu.dylib; recorded as kind `other` and never applied before", appears=("error (kernel-conv3d)",)),
    Cause("conv3d", "Conv3D refused below macOS 13.2 (torch 2.3.0-2.8.0)", S23_28, (),
          "opscan/knowledge/kernel_rules.yaml rule `conv3d-macos-13-2` (04f1eb2): kernel_checks.txt kc-d5f83f60, "
          "`_mps_convolution_impl`'s `TORCH_CHECK((input_t.dim() < 5) || is_macOS_13_2_or_newer, \"Conv3D is only "
          "supported on MPS for MacOS_13_2 or newer\")` in the 2.3.0-2.8.0 dylibs; the boards judge each release at "
          "its minimum macOS (12.3 for 2.3-2.5, 13.0 for 2.6-2.8)", appears=("error (kernel-conv3d-macos-13-2)",)),
    Cause("fallback-macos-13", "in-kernel CPU fallbacks below macOS 13 (torch 2.0-2.4)", S20_24, (),
          "opscan/knowledge/kernel_rules.yaml `fallbacks` (commits 30b3205, 56d5e46; merged 444b276, after the "
          "2026-12-03 boards): each kernel's own `TORCH_WARN_ONCE(\"... supported natively starting from macOS 13.0. "
          "Falling back on CPU\")` then the CPU op, whose message is in the 2.0.0-2.4.1 libtorch_cpu.dylib only "
          "(UpSample.mm check_mps_compatibility, Indexing.mm nonzero_mps, RangeFactories.mm randperm_out_mps, "
          "Unique.mm _unique2_mps); row cpu_fallback, rule kernel-fallback-<id>",
          appears=tuple(f"cpu_fallback (kernel-fallback-{i})" for i in FALLBACKS_MACOS_13)),
    Cause("fallback-nonzero-14", "nonzero's in-kernel CPU fallback below macOS 14 (torch 2.5-2.8)", S25_28, (),
          "opscan/knowledge/kernel_rules.yaml fallback `nonzero-macos-14` (30b3205): Indexing.mm nonzero_out_mps "
          "`if (!is_macos_13_or_newer(MACOS_VER_14_0_PLUS)) { TORCH_WARN_ONCE(...); nonzero_fallback(self) }`, its "
          "message in the 2.5.0-2.8.0 dylibs only", appears=("cpu_fallback (kernel-fallback-nonzero-macos-14)",)),
    Cause("fallback-grid-sampler", "grid_sampler_2d's in-kernel CPU fallback below macOS 13.2 (torch 2.0.x)", ("2.0",),
          (), "opscan/knowledge/kernel_rules.yaml fallback `grid-sampler-2d-2-0` (56d5e46): GridSampler.mm "
          "grid_sampler_2d_mps of 2.0 (message '... starting from macOS 13.1', check 13.2), in the 2.0.0-2.0.1 dylibs",
          appears=("cpu_fallback (kernel-fallback-grid-sampler-2d-2-0)",)),
    Cause("fallback-grid-sampler", "grid_sampler_2d's in-kernel CPU fallback below macOS 13.2 (torch 2.1-2.8)",
          S21_28, (), "opscan/knowledge/kernel_rules.yaml fallback `grid-sampler-2d-macos-13-2` (56d5e46): "
          "GridSampler.mm grid_sampler_2d_mps, message in the 2.1.0-2.8.0 dylibs",
          appears=("cpu_fallback (kernel-fallback-grid-sampler-2d-macos-13-2)",)),
    Cause("fallback-sort-topk", "sort and topk (k > 16) fall back to the CPU inside the kernel below macOS 13 "
          "(torch 2.0-2.4)", S20_24, (),
          "opscan/knowledge/kernel_rules.yaml fallbacks `sort-macos-13` (Sort.mm sort_stable_out_mps) and "
          "`topk-k16-macos-13` (Shape.mm topk_out_mps), read from the 2.0.0-2.4.1 dylibs by "
          "tools/kernel_fallback_strings.py (commit d2dc324, issue 38: 45 warnings, 0 unaccounted)",
          appears=tuple(f"cpu_fallback (kernel-fallback-{i})" for i in FALLBACKS_ISSUE_38)),
    Cause("lockstep", "torchvision's Python roi_align autograd (torch 2.4 API) judged as a missing API (2.0-2.3)",
          S20_23, (), "opscan/predict/python_paths.py:52 LOCKSTEP (commit 4eddb09): a torch API only a library "
          "paired with the release calls (torchvision 0.29.1 `torchvision/_autograd_registrations.py:344` "
          "`torch.library.register_autograd`, torch 2.4.0+; py_drift.txt: no `make_autograd_impl` before 2.4.0) is "
          "that library's drift; a Mac on torch 2.0-2.3 runs torchvision 0.15-0.18, which registered roi_align's "
          "autograd in C++", gone_rows=(
              "torchvision::roi_align error (missing-api)", "torchvision::_roi_align_backward error (missing-api)")),
    Cause("lockstep", "roi_align has no MPS kernel in torchvision 0.15 (torch 2.0.x): the row the error hid", ("2.0",),
          (), "opscan/knowledge/torchvision.yaml (rule torchvision-mps-later): pytorch/vision "
          "torchvision/csrc/ops/mps/roi_align_kernel.mm from 0.16 (torch 2.1); the 2026-12-01 board had these rows",
          appears=("torchvision::roi_align unsupported (torchvision-mps-later)",
                   "torchvision::_roi_align_backward unsupported (torchvision-mps-later)")),
    Cause("placement", "a tensor a factory makes with `device=` is on the device (issue 33)", ("2.12", "2.13"), (),
          "opscan/trace/host.py (commit a874791, issue 33): `torch.as_tensor(self.weights, dtype=dtype, "
          "device=device)` in torchvision 0.29.1 `torchvision/models/detection/_utils.py:157` (BoxCoder.encode_single) "
          "makes an MPS tensor on a Mac; the old trace counted a storage it had not seen made as a host tensor, so "
          "`wx = weights[0]`, `wy = weights[1]` (a 0-dim view at offset 1) met silent_bugs.yaml 187117's CPU-operand "
          "condition", gone_rows=("mismatch (silent-bug-187117)",)),
    Cause("composite-rows", "a release's static callee set no longer adds `conj_physical` to a real step (2.0.x)",
          ("2.0",), (), "opscan/predict/release_paths.py (commit 4b9025f, issue 38): conj_physical/resolve_conj "
          "return a real input as is (aten/src/ATen/native/UnaryOps.cpp `if (!self.is_complex()) return self`); "
          "composite_callees.txt's 2.0.0 repeat_interleave.self_int callees include it for the complex branch",
          gone_rows=("aten::conj_physical unsupported (release-callees)",)),
    Cause("composite-rows", "a `copy_` issued by a composite the release lacks keeps its mps-copy rule (2.0-2.3)",
          S20_23, (), "opscan/predict/release_paths.py (commit 4b9025f, issue 38): copy_ is MPS's own copy whichever "
          "composite issued it (F.rms_norm, absent before 2.4.0, is what timm 1.0.31 `timm/layers/fast_norm.py:27` "
          "replaces with its own pow/mean/rsqrt/mul there)",
          gone_rows=("aten::copy_ unknown (composite-no-callees)", "aten::copy_ unknown (release-callees-unknown)")),
    Cause("silent-34", "silent-correctness entries added by issue 34 (verdict `mismatch`)", (), (),
          "opscan/knowledge/silent_bugs.yaml, issue 34 (commits 8f2077d.. merged 3f2aec3 and 32bffd8): e.g. 114692 "
          "`zero_` of a contiguous slice at a storage offset writes past its end in 2.0.0-2.1.x (PR #114838), which "
          "torchvision 0.29.1 `torchvision/models/swin_transformer.py:178` (`qkv_bias[length : 2 * length].zero_()`, "
          "Swin V2) meets", appears=tuple(f"mismatch (silent-bug-{i})" for i in SILENT_ISSUE_34)),
    Cause("silent", "a known MPS silent-correctness bug (verdict `mismatch`)", (), (),
          "opscan/knowledge/silent_bugs.yaml (issue 26, after the 2026-12-01 boards): a call that meets an entry's "
          "condition in an affected release is predicted `mismatch` (rule silent-bug-<id>, the pytorch issue and "
          "fix PR in the row's source); the 2026-12-01 boards had no such verdict. Only the entries the 2026-12-03 "
          "boards met: a later entry's rows are claimed by the change that added it",
          appears=tuple(f"mismatch (silent-bug-{i})" for i in SILENT_ISSUE_26)),
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
        cause = next((c for c in CAUSES if c.claims(release, row[0], row[2], row[3])), None)
        if cause is None:
            left.append(("-",) + row)
        elif cause.key not in keys:
            keys.append(cause.key)
    for row in sorted(new):
        cause = next((c for c in CAUSES if c.adds(release, row[2], row[3], row[0]) or c.adds_op(release, row[0])),
                     None)
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
