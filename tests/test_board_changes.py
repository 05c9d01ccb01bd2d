"""tools/board_changes.py: the cell diff behind docs/leaderboard/CHANGES.md (issue 24, re-publish).

Boards are crafted with opscan's own Leaderboard and written by its own JSON and CSV writers, so the tool reads
what `opscan zoo` writes. A changed blocking row is explained only by a cause for its release; anything else is
listed as unexplained (exit 1), never absorbed.
"""

from __future__ import annotations

import gzip
import json
import sys

from conftest import REPO, TARGETS
from opscan.zoo.board import Cell, Leaderboard, ModelResult
from opscan.zoo.models import ZooModel
from opscan.zoo.outputs import render_csv, render_json
from opscan.zoo.releases import BlockingRow, ReleaseResult

sys.path.insert(0, str(REPO / "tools"))

from board_changes import CAUSES, main, read_board  # noqa: E402

RELEASES = ("2.0.0", "2.1.0", "2.5.0", "2.14.1")


def _cell(release: str, lane: str, *rows: tuple[str, ...]) -> Cell:
    blocking = tuple(BlockingRow(op, ("float32",), verdict, rule[0] if rule else "r", "e", "s", "predicted")
                     for op, verdict, *rule in rows)
    return Cell(ReleaseResult(release, lane, ("why",), not rows, blocking, 10))


def _board(*cells_of: tuple[str, tuple[Cell, ...]]) -> Leaderboard:
    target = f"{TARGETS / 'zoo_tiny.py'}:mlp"
    models = tuple(ModelResult(ZooModel(name, target), cells, 1.0) for name, cells in cells_of)
    return Leaderboard("crafted", RELEASES, models, "0.1.0", "2026-12-01T00:00:00Z")


LERP, NEG = ("aten::lerp_.Scalar", "unsupported"), ("aten::isneginf", "unsupported")
OLD = _board(("vit", (_cell("2.0.0", "dual-track", LERP), _cell("2.1.0", "dual-track", LERP),
                      _cell("2.5.0", "dual-track", NEG), _cell("2.14.1", "mac-first"))),
             ("cnn", (_cell("2.0.0", "dual-track", LERP), _cell("2.1.0", "mac-first"),
                      _cell("2.5.0", "mac-first"), _cell("2.14.1", "mac-first"))))
NEW = _board(("vit", (_cell("2.0.0", "mac-first"), _cell("2.1.0", "mac-first"),  # 2.1.0: no cause removes lerp_
                      _cell("2.5.0", "mac-first"), _cell("2.14.1", "dual-track", ("aten::take", "unsupported")))),
             ("cnn", (_cell("2.0.0", "mac-first"), _cell("2.1.0", "mac-first"),
                      _cell("2.5.0", "linux-gpu-first",
                            ("aten::mps_convolution_backward", "mismatch", "silent-bug-140902")),
                      _cell("2.14.1", "mac-first"))))


def test_changed_cells_are_claimed_by_their_cause_and_the_rest_are_unexplained(tmp_path, capsys):
    (tmp_path / "old.csv.gz").write_bytes(gzip.compress(render_csv(OLD).encode()))  # the old timm-full's form
    (tmp_path / "new.json").write_text(render_json(NEW))
    assert main([str(tmp_path / "old.csv.gz"), str(tmp_path / "new.json"), "-f", "json"]) == 1
    found = json.loads(capsys.readouterr().out)
    by_cell = {(c["model"], c["release"]): c for c in found["changes"]}
    assert (found["cells"], found["unchanged"], len(by_cell)) == (8, 2, 6)
    assert by_cell[("vit", "2.0.0")]["causes"] == ["lerp_"] and not by_cell[("vit", "2.0.0")]["unexplained"]
    assert by_cell[("cnn", "2.0.0")]["causes"] == ["lerp_"]
    assert by_cell[("vit", "2.5.0")]["causes"] == ["isneginf"] and not by_cell[("vit", "2.5.0")]["unexplained"]
    assert by_cell[("cnn", "2.5.0")]["causes"] == ["silent"]  # a new `mismatch` verdict (silent_bugs.yaml)
    # lerp_ has an MPS kernel from 2.1.0: its disappearing there is no release-faithful path, it is unexplained
    assert by_cell[("vit", "2.1.0")]["unexplained"] == [["-", "aten::lerp_.Scalar", "float32", "unsupported", "r"]]
    assert by_cell[("vit", "2.14.1")]["unexplained"] == [["+", "aten::take", "float32", "unsupported", "r"]]


def test_markdown_counts_causes_per_release_and_lists_unexplained_cells(tmp_path, capsys):
    (tmp_path / "old.json").write_text(render_json(OLD))
    (tmp_path / "new.json").write_text(render_json(NEW))
    assert main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--title", "t"]) == 1
    out = capsys.readouterr().out
    assert "8 cells compared: 6 changed (6 changed lane, 0 only their blocking rows), 2 unchanged." in out
    assert "| release | isneginf | lerp_ | silent | unexplained |" in out and "| 2.0.0 |  | 2 |  |  |" in out
    assert "| unexplained | 2 | 2 |" in out and "| 2.5.0 | mac-first | linux-gpu-first | 1 |" in out
    assert "- vit @ 2.1.0: dual-track -> mac-first; - aten::lerp_.Scalar float32 unsupported r" in out
    assert main([str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 0  # nothing changed: nothing to explain


def test_every_cause_names_its_source_and_a_bad_file_is_exit_2(tmp_path, capsys):
    assert all(c.evidence and any(s in c.evidence for s in ("wheel", ".yaml", ".txt", ".py:")) for c in CAUSES)
    (tmp_path / "r.json").write_text('{"schema": "opscan-report/3"}')
    assert main([str(tmp_path / "r.json"), str(tmp_path / "r.json")]) == 2
    assert "not an opscan-zoo/1 leaderboard" in capsys.readouterr().err
    (tmp_path / "new.json").write_text(render_json(NEW))
    assert read_board(tmp_path / "new.json")[("cnn", "2.5.0")].lane == "linux-gpu-first"


def _rows(*rows: tuple[str, str, str]) -> tuple[BlockingRow, ...]:
    return tuple(BlockingRow(op, ("float32",), verdict, rule, "e", "s", "predicted") for op, verdict, rule in rows)


def _ruled_cell(release: str, lane: str, *rows: tuple[str, str, str]) -> Cell:
    return Cell(ReleaseResult(release, lane, ("why",), not rows, _rows(*rows), 10))


def _ruled_board(releases: tuple[str, ...], *cells_of: tuple[str, tuple[Cell, ...]]) -> Leaderboard:
    target = f"{TARGETS / 'zoo_tiny.py'}:mlp"
    models = tuple(ModelResult(ZooModel(name, target), cells, 1.0) for name, cells in cells_of)
    return Leaderboard("crafted", releases, models, "0.1.0", "2026-12-07T00:00:00Z")


CONV3D = ("aten::_mps_convolution", "error", "kernel-conv3d")
ROI_ERR = ("torchvision::roi_align", "error", "missing-api")
ROI_LATER = ("torchvision::roi_align", "unsupported", "torchvision-mps-later")
SILENT_187117 = ("aten::mul.Tensor", "mismatch", "silent-bug-187117")
SORT = ("aten::sort.stable", "cpu_fallback", "kernel-fallback-sort-macos-13")
RE_RELEASES = ("2.0.0", "2.2.0", "2.4.0", "2.9.0", "2.12.0")
RE_OLD = _ruled_board(RE_RELEASES, ("r3d", tuple(_ruled_cell(r, "mac-first") for r in RE_RELEASES)),
                      ("rcnn", (_ruled_cell("2.0.0", "linux-gpu-first", ROI_ERR),
                                _ruled_cell("2.2.0", "linux-gpu-first", ROI_ERR),
                                _ruled_cell("2.4.0", "linux-gpu-first", ROI_ERR),
                                _ruled_cell("2.9.0", "mac-first"),
                                _ruled_cell("2.12.0", "linux-gpu-first", SILENT_187117))))
RE_NEW = _ruled_board(RE_RELEASES, ("r3d", (_ruled_cell("2.0.0", "linux-gpu-first", CONV3D),
                                            _ruled_cell("2.2.0", "linux-gpu-first", CONV3D),
                                            _ruled_cell("2.4.0", "mac-first"),
                                            _ruled_cell("2.9.0", "linux-gpu-first", CONV3D),  # 2.9 has 3-D conv
                                            _ruled_cell("2.12.0", "mac-first"))),
                      ("rcnn", (_ruled_cell("2.0.0", "dual-track", ROI_LATER, SORT),
                                _ruled_cell("2.2.0", "dual-track", SORT),
                                _ruled_cell("2.4.0", "mac-first"),  # 2.4 has register_autograd: no lockstep fix
                                _ruled_cell("2.9.0", "dual-track", SORT),  # sort's fallback is 2.0-2.4's
                                _ruled_cell("2.12.0", "mac-first"))))


def test_the_2026_12_07_causes_claim_their_rows_in_their_releases_only(tmp_path, capsys):
    """Issue 38's re-scan: Conv3D (2.0-2.2), torchvision's lockstep roi_align (2.0-2.3), the sort fallback (2.0-2.4)
    and the placement fix that retracts silent bug 187117 (2.12-2.13) each explain their rows in their releases;
    the same row in another release is unexplained."""
    (tmp_path / "old.json").write_text(render_json(RE_OLD))
    (tmp_path / "new.json").write_text(render_json(RE_NEW))
    assert main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), "-f", "json"]) == 1
    by_cell = {(c["model"], c["release"]): c for c in json.loads(capsys.readouterr().out)["changes"]}
    assert by_cell[("r3d", "2.0.0")]["causes"] == ["conv3d"] and by_cell[("r3d", "2.2.0")]["causes"] == ["conv3d"]
    assert by_cell[("r3d", "2.9.0")]["unexplained"] == [["+", *CONV3D[:1], "float32", *CONV3D[1:]]]
    assert by_cell[("rcnn", "2.0.0")]["causes"] == ["lockstep", "fallback-sort-topk"]
    assert not by_cell[("rcnn", "2.0.0")]["unexplained"] and not by_cell[("rcnn", "2.2.0")]["unexplained"]
    assert by_cell[("rcnn", "2.4.0")]["unexplained"] == [["-", ROI_ERR[0], "float32", *ROI_ERR[1:]]]
    assert by_cell[("rcnn", "2.9.0")]["unexplained"] == [["+", SORT[0], "float32", *SORT[1:]]]
    assert by_cell[("rcnn", "2.12.0")]["causes"] == ["placement"] and not by_cell[("rcnn", "2.12.0")]["unexplained"]
    assert ("r3d", "2.4.0") not in by_cell and ("r3d", "2.12.0") not in by_cell


def test_a_row_spelled_with_its_op_claims_that_op_only():
    """`gone_rows`/`appears` spelled "op verdict (rule)" name one op: the lockstep cause retracts roi_align's
    missing-api error, not another op's."""
    lockstep = next(c for c in CAUSES if c.key == "lockstep" and c.gone_rows)
    assert lockstep.claims("2.1.0", "torchvision::roi_align", "error", "missing-api")
    assert not lockstep.claims("2.1.0", "torchvision::nms", "error", "missing-api")
    assert not lockstep.claims("2.4.0", "torchvision::roi_align", "error", "missing-api")


def test_every_fallback_cause_covers_exactly_its_rules_releases():
    """A cause naming a kernel_rules.yaml fallback rule is valid in the series that rule's `releases` name, no more,
    no fewer (a fallback row in any other release is a bug in the board, not this cause)."""
    import yaml

    rules = yaml.safe_load((REPO / "opscan/knowledge/kernel_rules.yaml").read_text(encoding="utf-8"))["fallbacks"]
    series = {f"kernel-fallback-{f['id']}": {".".join(r.split(".")[:2]) for r in f["releases"]} for f in rules}
    named = 0
    for cause in CAUSES:
        for spelled in cause.appears:
            rule = spelled.rsplit("(", 1)[-1].rstrip(")")
            if rule.startswith("kernel-fallback-"):
                assert rule in series, f"{cause.key}: {rule} is no kernel_rules.yaml fallback"
                assert set(cause.series) == series[rule], (cause.key, rule)
                named += 1
    assert named >= 14


def test_a_silent_row_is_claimed_by_the_change_that_added_its_entry():
    """`mismatch` rows are claimed per silent_bugs.yaml entry: issue 26's entries (the 2026-12-03 boards) by `silent`,
    114692 (issue 34) by `silent-34`; a row of an entry neither names is unexplained, not absorbed by its verdict."""
    def keys(release: str, rule: str) -> list[str]:
        return [c.key for c in CAUSES if c.adds(release, "mismatch", rule, "aten::zero_")]

    assert keys("2.0.0", "silent-bug-114692") == ["silent-34"]
    assert keys("2.5.0", "silent-bug-140902") == ["silent"]
    assert keys("2.5.0", "silent-bug-999999") == []
