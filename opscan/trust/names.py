"""Spine: the one sanitiser for file and folder names opscan derives from user-controlled text.

A model's class name (`reports/<model>/`, `bundles/<model>/`), a zoo manifest's title (`reports/zoo-<title>/`),
an op name from a report (`repro/<op>/`) all become one path component through `safe_name`: letters, digits,
`-`, `_` and `.` only, never starting with `.` (so never `.`, `..` or a hidden file), no separator, no control
character, at most MAX_NAME characters and NAME_BYTES bytes of UTF-8 (a longer name keeps its start and gets a
digest of the whole, so two long names stay apart; a name of 96 four-byte letters would not fit a file system's
255 bytes). `inside(folder, relative)` is the last check before a relative path is joined to an
output folder: it must stay inside.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

MAX_NAME = 96
NAME_BYTES = 200  # UTF-8 bytes of a name: file systems allow 255 per component, and `.zip` or `-rerun` may follow


def safe_name(text: object, fallback: str = "model") -> str:
    """One path component from `text` (see the module docstring); `fallback` when nothing usable is left."""
    name = "".join(c if c.isalnum() and c.isprintable() or c in "-_." else "_" for c in str(text))
    name = "_" + name[1:] if name.startswith(".") else name
    if len(name) > MAX_NAME or len(name.encode("utf-8")) > NAME_BYTES:
        tail = hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:12]
        head = name[:MAX_NAME - 13]
        while len(head.encode("utf-8")) > NAME_BYTES - 13:  # letters of 2-4 bytes: fewer of them
            head = head[:-1]
        name = f"{head}-{tail}"
    return name.strip() or fallback


def inside(folder: Path, relative: str) -> Path:
    """`folder / relative` for a relative POSIX path whose every part is a plain name (no `..`, no absolute
    path, no empty or hidden-dot part); ValueError otherwise — a bug where it was made, never the user's."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or "\\" in relative or \
            any(p in ("", ".", "..") or safe_name(p, "") != p for p in parts):
        raise ValueError(f"{relative!r} is not a plain relative path")
    return Path(folder).joinpath(*parts)
