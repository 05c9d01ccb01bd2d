"""Spine: how opscan opens what it writes in an output folder — never through a link it did not make (issue 36).

An output folder may be shared (`-o /tmp/shared`), and whoever else can write there can plant names in it: a
symbolic link where opscan's temporary file, its `repro/` folder or its journal will be. Every file opscan
writes is opened here:

- `Folder(root)`: an output folder and the subfolders below it. The root is followed as the user named it (`-o`,
  `reports/<model>`: their choice); every component below it is opened with O_NOFOLLOW|O_DIRECTORY, one at a time
  and relative to its parent's descriptor (made, mode 0777 less the umask, when missing): a link anywhere below the
  root is refused (LinkError naming it), never followed, and nothing can swap a folder for a link between a check
  and a use;
- `Folder.temporary(...)`: a new file with an unpredictable name (`.<16 hex>.opscan-tmp`), created with
  O_CREAT|O_EXCL|O_NOFOLLOW: no name planted in advance (a link, a FIFO, a file) is ever opened; renamed into place
  with `Folder.replace` (a rename replaces a link at the final name itself, it does not write through it);
- `Folder.unlink(...)`: removal through the same walk: never follows a link (a link in the way: nothing removed);
- `open_append(path, fresh)`: append-only journals and logs: O_NOFOLLOW, a fresh one made with O_EXCL after the
  old name is removed, an existing one only when it is a regular file with no other hard link.

Standard library only; errors are OSError (LinkError is one, errno ELOOP) for the caller's one line.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
TEMPORARY_SUFFIX = ".opscan-tmp"


class LinkError(OSError):
    """A symbolic link (or something that is not a folder) where opscan needs a folder of its own."""


def link_error(path: Path) -> LinkError:
    kind = "a symbolic link" if os.path.islink(path) else "not a folder"
    return LinkError(errno.ELOOP, f"{path} is {kind}: opscan never writes or removes through a link inside its "
                                  "output folder", str(path))


class Folder:
    """An output folder opened once; its subfolders by relative parts, walked without following links."""

    def __init__(self, root: Path, made=None) -> None:
        self.root = Path(root)
        self.made = made or (lambda path: None)  # told each folder made below the root
        self._fds: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def fd(self, parts: tuple[str, ...] = (), create: bool = True) -> int | None:
        """The descriptor of root/parts (made when missing and `create`; None when missing otherwise)."""
        if parts in self._fds:
            return self._fds[parts]
        if not parts:
            fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        else:
            parent = self.fd(parts[:-1], create)
            if parent is None:
                return None
            fd = self._child(parent, parts, create)
            if fd is None:
                return None
        self._fds[parts] = fd
        return fd

    def _child(self, parent: int, parts: tuple[str, ...], create: bool) -> int | None:
        name, path = parts[-1], self.root.joinpath(*parts)
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise link_error(path) from None
            raise
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
            self.made(path)
        except FileExistsError:  # made meanwhile: opened (never followed) below
            pass
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise link_error(path) from None
            raise

    def temporary(self, parts: tuple[str, ...], data: bytes, mode: int | None = None) -> str:
        """A new file in root/parts holding `data`, synced (see the module docstring); its name there."""
        folder = self.fd(parts)
        for _ in range(100):
            name = f".{secrets.token_hex(8)}{TEMPORARY_SUFFIX}"
            try:
                fd = os.open(name, _NEW, 0o666, dir_fd=folder)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", str(self.root.joinpath(*parts)))
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            self.unlink(parts, name)
            raise
        finally:
            os.close(fd)
        return name

    def replace(self, parts: tuple[str, ...], temporary: str, name: str) -> None:
        """Rename root/parts/temporary to root/parts/name (a link at `name` is replaced, not followed)."""
        folder = self.fd(parts)
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)

    def unlink(self, parts: tuple[str, ...], name: str) -> bool:
        """Remove root/parts/name (a file or a link, never what a link points to); whether it was removed. A link
        or a missing folder on the way: nothing is removed."""
        try:
            folder = self.fd(parts, create=False)
            if folder is None:
                return False
            os.unlink(name, dir_fd=folder)
        except OSError:
            return False
        return True


def open_append(path: Path, fresh: bool = False) -> int:
    """A descriptor for appending to the journal or log at `path`: fresh (an old file or link of that name removed,
    a new one made with O_EXCL), else continued when it exists — only a regular file with one link — or made with
    O_EXCL; never through a link."""
    path = Path(path)
    if fresh:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise link_error(path) from None
            raise
        else:
            return _own_file(fd, path)
    return os.open(path, _NEW | os.O_APPEND, 0o666)


def _own_file(fd: int, path: Path) -> int:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise LinkError(errno.ELOOP, f"{path} is not a file of its own (a device, a FIFO or a hard link): opscan "
                                     "appends only to its own journals", str(path))
    return fd
