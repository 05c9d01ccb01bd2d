"""The README is the front page and docs/ the manual: every relative link in README.md and docs/**/*.md resolves
(the file exists; a #anchor names a heading of the target, as GitHub slugs it), every docs page is reached from the
README (directly or through pages it links) and links back to it, and the README keeps what the contract puts
there (exit codes, verdicts, lanes: checked against the code's enums) while staying a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opscan.errors import ExitCode
from opscan.graph.lanes import LaneName
from opscan.verdict import Verdict

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FRONT_PAGE_LINES = 350  # issue 23: a few hundred lines; each command's and stage's manual lives in docs/

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def prose(text: str, blank_code: bool = True) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks, inline code spans blanked unless asked."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            out.append((number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line) if blank_code else line))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image outside code."""
    return [(number, m.group(1)) for number, line in prose(text) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a Markdown text; repeated headings get -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(text, blank_code=False):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def resolve(page: Path, target: str) -> tuple[Path | None, str]:
    """(the file or folder a relative link names, its anchor); (None, '') for an external link."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None, ""
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def broken(page: Path) -> list[str]:
    """Every link of one page that does not resolve, as 'page:line: target (why)'."""
    problems = []
    for number, target in links(page.read_text(encoding="utf-8")):
        path, anchor = resolve(page, target)
        if path is None:
            continue
        where = f"{page.name}:{number}: {target}"
        if not path.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
            problems.append(f"{where} (no heading #{anchor} in {path.name})")
        elif anchor and path.suffix != ".md":
            problems.append(f"{where} (an anchor into a file that is not Markdown)")
    return problems


def linked_pages(page: Path) -> set[Path]:
    """The Markdown files a page links to (a folder link counts as its README.md)."""
    out = set()
    for _, target in links(page.read_text(encoding="utf-8")):
        path, _ = resolve(page, target)
        if path is None or path == page:
            continue
        if path.is_dir():
            path = path / "README.md"
        if path.suffix == ".md" and path.exists():
            out.add(path)
    return out


def section(text: str, title: str) -> str:
    """The body of the README's `## title` section."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert links(page.read_text(encoding="utf-8")), f"{page.name} links nowhere"
    assert broken(page) == []


def test_every_docs_page_is_reached_from_the_readme_and_links_back():
    reached, todo = set(), [README]
    while todo:
        for path in linked_pages(todo.pop()) - reached:
            if DOCS in path.parents:
                reached.add(path)
                todo.append(path)
    pages = set(DOCS.rglob("*.md"))
    assert len(pages) >= 20
    assert sorted(str(p.relative_to(REPO)) for p in pages - reached) == []
    assert sorted(str(p.relative_to(REPO)) for p in pages if README not in linked_pages(p)) == []


def test_readme_map_links_each_docs_page_directly():
    mapped = linked_pages(README)
    top = {p for p in DOCS.glob("*.md")} | {DOCS / "leaderboard" / "README.md"}
    assert sorted(str(p.relative_to(REPO)) for p in top - mapped) == []


def test_readme_stays_a_front_page_with_the_contract_sections():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FRONT_PAGE_LINES
    codes = dict(re.findall(r"^\| (\d) \| (.+) \|$", section(text, "Exit codes"), re.M))
    assert sorted(int(c) for c in codes) == sorted(int(c) for c in ExitCode)
    ranks = {}
    for names, rank in re.findall(r"^\| (`[^|]+) \|.*\| (\d) \|$", section(text, "Verdicts"), re.M):
        for name in re.findall(r"`([a-z_]+)`", names):
            ranks[name] = int(rank)
    assert ranks == {v.value: v.rank for v in Verdict}
    lanes = re.findall(r"^- `([a-z-]+)`:", section(text, "Lanes"), re.M)
    assert lanes == [lane.value for lane in LaneName]
    assert "docs/report-schema.md" in section(text, "Report JSON (schema_version 4)")


def test_the_checker_catches_what_it_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# The `b` page: a–z\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "README.md"
    page.write_text("# Top\n\n[ok](docs/b.md#the-b-page-az) [dup](docs/b.md#twice-1) [self](#top)\n"
                    "[gone](docs/c.md) [bad anchor](docs/b.md#nope) [web](https://example.com/x)\n"
                    "`[in code](docs/none.md)`\n\n```\n[fenced](docs/none.md)\n```\n")
    assert [p.split(": ", 1)[1] for p in broken(page)] == [
        "docs/c.md (no such file)", "docs/b.md#nope (no heading #nope in b.md)"]
    assert linked_pages(page) == {tmp_path / "docs" / "b.md"}
    assert slug("Fake tensors: 7B–70B steps without the memory") == "fake-tensors-7b70b-steps-without-the-memory"
    assert slug("`opscan accept`: the acceptance run") == "opscan-accept-the-acceptance-run"


FIRST_SCREEN = 65  # lines: what a reader sees before scrolling far


def test_the_readmes_first_screen_answers_will_my_step_run_and_what_to_do():
    # issue 35: a short pitch, the lane legend, the install and first scan, what to do when it does not run, and a
    # quick test run with its time beside the full suite's — before the manual starts
    lines = README.read_text(encoding="utf-8").splitlines()
    top = "\n".join(lines[:FIRST_SCREEN])
    pitch = lines[2:lines.index("## Lanes")]
    assert len([line for line in pitch if line.strip()]) <= 3, pitch
    assert "## Lanes" in top and all(f"- `{lane.value}`:" in top for lane in LaneName)
    assert "opscan examples/cnn.py:build_model\n```" in top and "**What to do if not**" in top
    assert "python -m pytest -q -m quick" in top and re.search(r"full suite takes about \d+", top)
