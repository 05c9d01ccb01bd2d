"""Leaderboards say what they were made with, and whether they are still current (issue 38).

A board's JSON names the opscan commit, the torch that traced, the knowledge base's digest (each data file's too) and
the macOS each release is judged on; each model records the commit and knowledge digest it was scanned with (a
resumed run can mix them). When the knowledge base or the rules change after a board was made, the board is stale
until re-scanned, and must say so per model in its stale.json (tools/board_stale.py --mark): the last test fails
otherwise.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from opscan.zoo.board import Cell, Leaderboard, ModelResult, make_board
from opscan.zoo.models import ZooModel
from opscan.zoo.provenance import knowledge_digest, knowledge_files, made_with, stale_models
from opscan.zoo.releases import ReleaseResult

ROOT = Path(__file__).resolve().parent.parent
BOARDS = sorted(p.parent for p in (ROOT / "docs" / "leaderboard").glob("*/leaderboard.json"))


def _model(name: str, made: dict | None) -> ModelResult:
    cell = Cell(ReleaseResult("2.14.1", "mac-first", ("all 3 rows are native",), True, (), 3))
    return ModelResult(ZooModel(name, "m.py:build"), (cell,), 1.0, None, False, made)


def test_a_board_names_its_commit_torch_knowledge_and_macos():
    now = made_with()
    board = make_board("t", ("2.0.0", "2.14.1"), [_model("a", {"commit": now["commit"],
                                                                 "knowledge": now["knowledge"]})])
    data = json.loads(json.dumps(board.to_dict()))
    prov = data["provenance"]
    assert prov["torch"] and prov["opscan"] and prov["knowledge"] == knowledge_digest(knowledge_files())
    assert prov["macos_by_release"] == {"2.0.0": "12.3", "2.14.1": "14.0"}  # each release's minimum (facts.yaml)
    assert "kernel_rules.yaml" in prov["knowledge_files"] and "releases/index.txt" in prov["knowledge_files"]
    assert data["models"][0]["knowledge"] == prov["knowledge"]
    again = Leaderboard.from_dict(data)
    assert again.provenance == prov and again.models[0].made == {"commit": now["commit"],
                                                                 "knowledge": now["knowledge"]}
    assert stale_models(data) == {}


def test_a_changed_knowledge_file_makes_every_model_made_before_it_stale():
    now = made_with()
    board = make_board("t", ("2.14.1",), [_model("a", {"commit": "x", "knowledge": now["knowledge"]}),
                                         _model("b", None)]).to_dict()
    files = {**knowledge_files(), "kernel_rules.yaml": "0" * 12}  # the rules edited since the board was made
    stale = stale_models(board, files)
    assert set(stale) == {"a", "b"}
    assert "kernel_rules.yaml changed" in stale["a"] and now["knowledge"] in stale["a"]
    assert "made before" in stale["b"]


def _tool():
    spec = importlib.util.spec_from_file_location("board_stale", ROOT / "tools" / "board_stale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("board_dir", BOARDS, ids=lambda p: p.name)
def test_a_published_board_is_current_or_says_which_models_are_stale(board_dir):
    """Fails when the knowledge base or rules changed since the board was made and it was neither re-scanned
    (`opscan zoo ... -o DIR`) nor marked (`python tools/board_stale.py --mark DIR`)."""
    tool = _tool()
    assert tool.recorded(board_dir) == tool.expected(board_dir), (
        f"{board_dir.name}: re-scan it, or run python tools/board_stale.py --mark {board_dir.relative_to(ROOT)}")
