"""The tools' shared ending: write a generated knowledge table, or (--check) compare it with the shipped one."""

from __future__ import annotations


def write_or_check(prog: str, path: str, text: str, check: bool) -> int:
    """--check: exit status 0 when the file at `path` holds `text`, else 1; otherwise write `text` there (0)."""
    if check:
        with open(path, encoding="utf-8") as fh:
            same = fh.read() == text
        print(f"{prog}: {path} {'matches' if same else 'differs'}")
        return 0 if same else 1
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"{prog}: wrote {path} ({len(text.splitlines())} lines)")
    return 0
