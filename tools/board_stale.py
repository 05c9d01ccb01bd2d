#!/usr/bin/env python3
"""Whether each published leaderboard is current: its models were scanned with the knowledge base opscan ships now.

A board's JSON records, per model, the knowledge digest it was scanned with (opscan/zoo/provenance.py). When the
knowledge base or the kernel rules change after it was made, its cells may be wrong until it is re-scanned; the
board must then say so, per model, in `stale.json` beside it:

    {"knowledge": "<the digest now>", "models": {"<model>": "<why: the digest it was made with, the files changed>"}}

    python tools/board_stale.py docs/leaderboard/torchvision docs/leaderboard/timm-sample          # check
    python tools/board_stale.py --mark docs/leaderboard/torchvision docs/leaderboard/timm-sample   # write stale.json

A check prints each board's stale models and exits 1 when a board's stale.json does not say exactly that (or a
current board still has one); --mark writes it (and removes it from a current board). A re-scan
(`opscan zoo ... -o DIR`) makes the board current. tests/test_board_provenance.py runs the check on the published
boards. Exit codes: 0 current or marked, 1 stale and not marked so, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opscan.zoo.provenance import knowledge_digest, knowledge_files, stale_models  # noqa: E402

STALE_NAME = "stale.json"


def expected(board_dir: Path) -> dict | None:
    """What the board's stale.json must hold (None: the board is current and must have none)."""
    board = json.loads((board_dir / "leaderboard.json").read_text(encoding="utf-8"))
    stale = stale_models(board)
    if not stale:
        return None
    return {"knowledge": knowledge_digest(knowledge_files()), "models": dict(sorted(stale.items()))}


def recorded(board_dir: Path) -> dict | None:
    """The board's stale.json (None: absent)."""
    path = board_dir / STALE_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("boards", nargs="+", type=Path, help="board folders (holding leaderboard.json)")
    parser.add_argument("--mark", action="store_true", help="write each board's stale.json")
    args = parser.parse_args(argv)
    bad = 0
    for board_dir in args.boards:
        if not (board_dir / "leaderboard.json").is_file():
            print(f"board_stale: {board_dir} has no leaderboard.json", file=sys.stderr)
            return 2
        want = expected(board_dir)
        path = board_dir / STALE_NAME
        if args.mark:
            if want is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(json.dumps(want, indent=1) + "\n", encoding="utf-8")
        stale = len(want["models"]) if want else 0
        ok = recorded(board_dir) == want
        bad += not ok
        print(f"{board_dir}: {stale} stale models"
              + ("" if ok else f" — {STALE_NAME} does not say so (run with --mark, or re-scan the board)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
