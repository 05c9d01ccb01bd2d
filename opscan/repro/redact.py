"""Repro stage: paths and user names out of the texts meant for a public tracker (ISSUE.md and the scripts).

The report keeps the target as given (`model`, the `repro` section's command line): often an absolute path with
the user's name in it. By default every string of the report dict the repro files are rendered from is redacted:

- the project's folder becomes nothing: file names relative to the project (the target file's nearest folder
  holding `.git`, `pyproject.toml`, `setup.py` or `setup.cfg`; else the target file's own folder);
- a home folder (this machine's, `/Users/NAME`, `/home/NAME`, `~NAME/`: a report measured on a Mac carries that
  user's paths in PyTorch's messages) becomes `~`; `/Users/NAME` in every form — inside another token
  (`--data=/Users/x`, `file:///Users/x`), in any case, with `\\` or `%2F` separators, doubled separators or `./`
  between them — and `/home/NAME` where a path starts; `/Users/runner/` (PyTorch's own build paths in its
  warnings) stays.

`--keep-paths` skips it. Everything here is a function of the report and this machine's home folder and files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from opscan.target.user_code import project_folder

DATA = frozenset({"inline", "feed_inline"})  # tensor values (base64): data, never text
_SEP = r"(?:/|\\|%2[fF])"  # a path separator: /, \ (C:\Users), %2F (a URL)
_GAP = rf"{_SEP}+(?:\.{_SEP}+)*"  # one or more separators, with any `./` between them (non-canonical paths)
_NAME = rf"(?!runner{_SEP})(?!\.\.?(?:{_SEP}|$))(?:(?!{_SEP})[^\s'\"`])+"  # runner: PyTorch's build machines
# /Users/NAME (a Mac's home folders) wherever it stands: inside a token (--data=/Users/x, file:///Users/x,
# /System/Volumes/Data/Users/x), in any case (APFS is case-insensitive), with doubled separators or `./` between;
# /home/NAME at the start of a path (not inside a URL's or base64's text)
HOMES = re.compile(rf"(?i:{_GAP}users{_GAP}){_NAME}|(?<![\w.+-])(?:{_GAP})home{_GAP}{_NAME}")
TILDE_USER = re.compile(r"(?<![\w~])~[A-Za-z_][\w.-]*(?=/)")  # ~alice/...: another user's home


@dataclass(frozen=True)
class Redaction:
    """What to take out: the project folder (-> relative names) and the home folder (-> ~)."""

    project: str | None
    home: str | None

    def text(self, value: str) -> str:
        """`value` with the project folder dropped and home folders written `~`."""
        if self.project:
            value = value.replace(self.project.rstrip("/") + "/", "")
        if self.home and self.home not in ("/", ""):
            value = value.replace(self.home.rstrip("/"), "~")
        return TILDE_USER.sub("~", HOMES.sub("~", value))

    def apply(self, value):
        """Every string in a JSON-like value redacted (keys too)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.apply(k): v if k in DATA else self.apply(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.apply(v) for v in value]
        return value


def redaction_for(report: dict) -> Redaction:
    """The redaction of a report dict: its target's project folder, and this machine's home folder."""
    return Redaction(project_of(str(report.get("model") or "")), os.path.expanduser("~"))


def project_of(target: str) -> str | None:
    """The project folder of an absolute FILE.py:FUNCTION target (see the module docstring); None for a module
    target or a relative path (nothing absolute to take out)."""
    location = target.rpartition(":")[0] or target
    if not location.startswith("/") or not location.endswith(".py"):
        return None
    return project_folder(location)
