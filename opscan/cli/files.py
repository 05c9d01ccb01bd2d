"""CLI layer: the files opscan writes — whole or not at all — and the output folders it may write them into.

What makes folders or writes takes the run's context (opscan/target/run.py RunContext): the folders made are the run's.

- `write_whole(ctx, files, root=)`: every file is written to a new temporary beside it (an unpredictable name made
  with O_CREAT|O_EXCL|O_NOFOLLOW: opscan/trust/output.py), flushed and fsynced, then all of them are renamed into
  place. Below `root` (the output folder) no link is followed: a link planted there (a linked repro/) is exit 2
  naming it. A failure (a full disk, a file-size limit, a read-only folder) removes the temporaries and raises
  OutputError naming the file: nothing partial is left, and the files an earlier run wrote there stay as they were.
- `write_under(ctx, folder, files)`: the same for files named by paths relative to `folder` (scripts executable).
- `prepare_folder(ctx, path)`: create the folder (remembering what it created: a run that ends without writing
  into it removes the folders it made, when they are still empty) and check that it is writable (a new file of
  an unpredictable name, O_EXCL|O_NOFOLLOW, made and removed).
- `stale_repro(out_dir, current)` / `remove_stale`: the repro files (repro/<op>/repro_N.py, ISSUE.md) of an earlier
  run that the report now written does not have, removed once the new files are in place — never through a link.
- `claim(ctx, folder, identity)`: a folder holding another target's results (its `.opscan-target.json`, or an
  earlier report.json naming another target) is refused with exit 2; nothing is ever deleted, and the same
  target's journal stays for `--resume`. The marker is written before anything else goes into the folder.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from pathlib import Path

from opscan.errors import OutputError, UsageError
from opscan.target.run import RunContext
from opscan.trust.names import inside
from opscan.trust.output import Folder, LinkError
from opscan.trust.read import MAX_BYTES, SMALL_BYTES, read_json

MARKER = ".opscan-target.json"
_FIX = {errno.ENOSPC: "free some space and rerun", errno.EDQUOT: "free some space (disk quota) and rerun",
        errno.EFBIG: "the file-size limit (ulimit -f) is too small for it: raise it and rerun",
        errno.EROFS: "pass -o with a folder on a writable file system"}


def write_whole(ctx: RunContext, files: dict[Path, str | bytes], executable: tuple[Path, ...] = (),
                root: Path | None = None) -> list[Path]:
    """Write every file whole (see the module docstring); the paths written. Below `root` (the output folder)
    no link is followed; a file outside it is written in its own folder."""
    placed = {Path(path): _place(Path(path), root) for path in files}
    current = next(iter(files), Path("?"))
    folders: dict[Path, Folder] = {}
    temporaries: list[tuple[Folder, tuple[str, ...], str]] = []
    try:
        for anchor in dict.fromkeys(a for a, _ in placed.values()):
            make_folders(ctx, anchor)
            folders[anchor] = Folder(anchor, ctx.folder_made)
        for current, content in files.items():
            anchor, parts = placed[Path(current)]
            data = content.encode("utf-8") if isinstance(content, str) else content
            name = folders[anchor].temporary(parts, data, 0o755 if current in executable else None)
            temporaries.append((folders[anchor], parts, name))
        for current, (folder, parts, name) in zip(files, temporaries):
            folder.replace(parts, name, Path(current).name)
    except OSError as exc:
        for folder, parts, name in temporaries:
            folder.unlink(parts, name)
        raise output_error(exc, current) from None
    finally:
        for folder in folders.values():
            folder.close()
    return list(files)


def _place(path: Path, root: Path | None) -> tuple[Path, tuple[str, ...]]:
    """(the folder walked from, the subfolders below it) of a file: below `root` when it is there."""
    if root is not None:
        try:
            parts = path.parent.relative_to(root).parts
        except ValueError:
            parts = None
        if parts is not None and ".." not in parts:
            return Path(root), parts
    return path.parent, ()


def write_file(ctx: RunContext, path: Path, content: str | bytes, executable: bool = False) -> Path:
    """One file, whole or not at all."""
    return write_whole(ctx, {Path(path): content}, (Path(path),) if executable else ())[0]


def write_under(ctx: RunContext, folder: Path, files: dict[str, str]) -> list[Path]:
    """Files named relative to `folder` (render_files' output; scripts executable), whole or not at all, no link
    below `folder` followed; the paths written."""
    paths = {inside(folder, rel): text for rel, text in files.items()}
    return write_whole(ctx, paths, tuple(p for p in paths if p.suffix == ".py"), root=folder)


def output_error(exc: OSError, path) -> OutputError:
    """The one line for a file that could not be written: which file, why, and what to do."""
    if isinstance(exc, LinkError):
        return OutputError(f"cannot write {path}: {exc.strerror} — remove {exc.filename} (or pass -o with a folder "
                           "only you write to)")
    fix = _FIX.get(exc.errno, "pass -o with a writable folder")
    return OutputError(f"cannot write {path}: {exc.strerror or exc} — {fix}")


def is_open(fd: int) -> bool:
    """Whether file descriptor `fd` is open (a closed stdout or stderr is not)."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def make_folders(ctx: RunContext, folder: Path) -> None:
    """mkdir -p, recording each folder made (a run that ends without writing into them removes them again)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for made in reversed(missing):
        ctx.folder_made(made)


def prepare_folder(ctx: RunContext, folder: Path) -> Path:
    """Create `folder` (recording the folders made) and check that files can be written there."""
    try:
        make_folders(ctx, folder)
        fd, probe = tempfile.mkstemp(prefix=".opscan-write-test.", dir=folder)  # O_EXCL|O_NOFOLLOW, a new name
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"cannot write reports to {str(folder)!r}: {exc.strerror or exc} — pass -o with a "
                          "writable folder") from None
    return folder


def remove_created(ctx: RunContext) -> None:
    """Remove the folders this run created and left empty (an interrupted or failed run), deepest first."""
    while ctx.created:
        remove_if_empty(ctx.created.pop())


def remove_if_empty(folder) -> None:
    """rmdir `folder` when nothing but this target's marker is in it (the marker goes too)."""
    try:
        if [p.name for p in Path(folder).iterdir()] == [MARKER]:
            (Path(folder) / MARKER).unlink()
        Path(folder).rmdir()
    except OSError:
        pass  # not empty, or gone: leave it


def check_owner(folder: Path, mine: dict) -> None:
    """Refuse (exit 2) a folder holding another target's results."""
    held = held_by(folder)
    if held is not None and not same_target(held, mine):
        raise UsageError(f"{folder} holds the results of another target ({held.get('target')}) — pass -o with "
                         "another folder for this one, or move that folder away (opscan never deletes results)")


def claim(ctx: RunContext, folder: Path, mine: dict) -> Path:
    """Refuse a folder holding another target's results; else create it and mark it as this target's."""
    check_owner(folder, mine)
    prepare_folder(ctx, folder)
    if held_by(folder) != mine:
        write_file(ctx, folder / MARKER, json.dumps(mine, indent=1, sort_keys=True) + "\n")
    return folder


def held_by(folder: Path) -> dict | None:
    """Whose results the folder holds: its marker, else the target an earlier report.json names; None: nobody's."""
    for name, read in ((MARKER, lambda d: d), ("report.json", _report_identity)):
        path = folder / name
        if path.is_file():
            try:  # the one reader (opscan/trust/read.py): a huge or deeply nested file is unreadable, not a bug
                found = read(read_json(path, name, "", max_bytes=SMALL_BYTES if name == MARKER else MAX_BYTES))
            except (UsageError, TypeError, AttributeError, KeyError):
                found = None
            return found if isinstance(found, dict) else {"target": f"a {name} opscan cannot read"}
    return None


def _report_identity(report: dict) -> dict:
    return {"target": report["model"], "resolved": None}


def identity(spec: str) -> dict:
    """What a folder's results belong to: the TARGET as given and with its file part made absolute (its factory
    arguments may differ: a rerun with other --arg values is the same target)."""
    location, sep, func = spec.rpartition(":")
    resolved = spec
    if sep and (location.endswith(".py") or os.sep in location):
        resolved = f"{os.path.abspath(location)}:{func}"
    return {"target": spec, "resolved": resolved}


def same_target(held: dict, mine: dict) -> bool:
    """The same TARGET (an earlier report.json names it as it was typed, maybe relative to another folder)."""
    if held.get("resolved") is None:
        old = str(held.get("target"))
        return mine["resolved"] == old or mine["resolved"].endswith(os.sep + old) or mine["target"] == old
    return held.get("resolved") == mine["resolved"]


REPRO_FILE = re.compile(r"repro_\d+\.py|ISSUE\.md")


def stale_repro(out_dir: Path, current: set[Path]) -> list[Path]:
    """The files an earlier run wrote into `out_dir`/repro/<op>/ (repro_N.py, ISSUE.md: opscan's names only) that
    the report now written does not have: after a rescan (another --arg, a fixed model, no --repro) repro/ holds
    the current report's findings only. Links are not followed: a linked repro/ or op folder holds nothing of ours."""
    folder = out_dir / "repro"
    if folder.is_symlink() or not folder.is_dir():
        return []
    ops = [p for p in folder.iterdir() if not p.is_symlink() and p.is_dir()]
    return sorted(p for op in ops for p in op.iterdir() if REPRO_FILE.fullmatch(p.name) and p not in current
                  and not p.is_symlink() and p.is_file())


def remove_stale(paths: list[Path], folder: Path) -> None:
    """Remove `paths` (stale_repro's, once the new files are in place; `folder` is OUT/repro), walking from the
    output folder without following a link (a link in the way: nothing is removed), then the op folders left
    empty."""
    with Folder(folder.parent) as out:
        for path in paths:
            out.unlink(path.parent.relative_to(folder.parent).parts, path.name)
    for parent in sorted({p.parent for p in paths}, reverse=True):
        remove_if_empty(parent)
    if paths:
        remove_if_empty(folder)
