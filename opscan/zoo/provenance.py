"""What a leaderboard was made with, and whether it is still current (issue 38).

A board's cells are predictions: they hold only for the opscan code, the knowledge base and the assumed macOS they
were made with. `made_with()` is what one zoo worker scans with — the opscan commit, the torch (and torchvision,
timm) that traced, and the knowledge base's digest: a sha256 over every data file under opscan/knowledge/ (the
release entries, facts, kernel checks and rules, ...), with each file's own digest so a later check can say which
changed. `board_provenance()` adds the macOS each release is judged on (the zoo passes none: each release's
minimum, facts.yaml `min_macos`). `stale_models(board, files)` names the models whose cells were made with another
knowledge base than `files` (the current one by default), and the files that differ. No torch import at module
level.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KNOWLEDGE_DIR = Path(__file__).resolve().parent.parent / "knowledge"
DATA_SUFFIXES = (".txt", ".yaml")
# data files no prediction reads (why each kernel check is not encoded): changing them moves no cell
NOT_PREDICTIVE = frozenset({"kernel_decisions.yaml", "kernel_cpu_twins.txt"})


def knowledge_files(folder: Path = KNOWLEDGE_DIR) -> dict[str, str]:
    """Relative path -> the first 12 hex digits of its sha256, for every data file of the knowledge base."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in DATA_SUFFIXES and path.name not in NOT_PREDICTIVE:
            out[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return out


def knowledge_digest(files: Mapping[str, str]) -> str:
    """One digest (12 hex digits) of a knowledge_files() mapping."""
    text = "".join(f"{name} {digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def git_commit(start: Path = KNOWLEDGE_DIR) -> str:
    """The commit checked out where opscan is imported from (read from .git, no git process), or "" outside one."""
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.is_file():  # a worktree: "gitdir: PATH"
            git_dir = Path(dot_git.read_text(encoding="utf-8").split(":", 1)[1].strip())
        elif dot_git.is_dir():
            git_dir = dot_git
        else:
            continue
        return _resolve(git_dir)
    return ""


def _resolve(git_dir: Path) -> str:
    """HEAD's commit in `git_dir` (loose ref, packed ref, or a worktree's common dir)."""
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    if not head.startswith("ref: "):
        return head[:12]
    ref = head[5:]
    common = git_dir
    if (git_dir / "commondir").is_file():
        common = (git_dir / (git_dir / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for folder in (git_dir, common):
        if (folder / ref).is_file():
            return (folder / ref).read_text(encoding="utf-8").strip()[:12]
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    return ""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=1)
def made_with() -> dict[str, Any]:
    """What this process scans with: opscan version and commit, the tracing libraries, the knowledge digest."""
    from opscan import __version__

    return {"opscan": __version__, "commit": git_commit(), "torch": _version("torch"),
            "torchvision": _version("torchvision"), "timm": _version("timm"),
            "knowledge": knowledge_digest(_shipped_files())}


@functools.lru_cache(maxsize=1)
def _shipped_files() -> dict[str, str]:
    return knowledge_files()


def assumed_macos(releases: tuple[str, ...]) -> dict[str, str]:
    """Release -> the macOS its cells assume: the release's minimum (the zoo passes no --macos)."""
    from opscan.knowledge import load_knowledge

    return {r: ".".join(str(v) for v in load_knowledge(release=r).macos) for r in releases}


def board_provenance(releases: tuple[str, ...], models: list[dict[str, Any]]) -> dict[str, Any]:
    """The board's provenance: this process's made_with() (the files digested one by one), the knowledge digests
    and commits its models were made with (a resumed run can mix them), and the macOS per release."""
    now = made_with()
    digests = sorted({m.get("knowledge") or "unknown" for m in models}) or [now["knowledge"]]
    commits = sorted({m.get("commit") or "unknown" for m in models}) or [now["commit"]]
    return {**now, "knowledge": digests[0] if len(digests) == 1 else "mixed", "knowledge_digests": digests,
            "commits": commits, "knowledge_files": dict(_shipped_files()),
            "macos": "each release's minimum macOS (facts.yaml min_macos); no --macos given",
            "macos_by_release": assumed_macos(releases)}


def stale_models(board: Mapping[str, Any], files: Mapping[str, str] | None = None) -> dict[str, str]:
    """Model name -> why its cells are stale: made with another knowledge base than `files` (default: the shipped
    one), naming the files that differ where the board recorded them; {} when every model is current."""
    files = dict(knowledge_files() if files is None else files)
    now = knowledge_digest(files)
    provenance = board.get("provenance") or {}
    recorded = provenance.get("knowledge_files") or {}
    changed = sorted(n for n in set(recorded) | set(files) if recorded.get(n) != files.get(n)) if recorded else []
    out = {}
    for model in board.get("models", ()):
        made = model.get("knowledge")
        if made == now:
            continue
        if not made:
            out[model["model"]["name"]] = "made before boards recorded their knowledge base"
        else:
            shown = f": {', '.join(changed[:6])}{' …' if len(changed) > 6 else ''} changed" if changed else ""
            out[model["model"]["name"]] = f"knowledge base {made}, now {now}{shown}"
    return out
