"""The HTML report (opscan/render/html.py): one self-contained file, the finding drawn and highlighted in its
module context, checked as text and in a real headless browser (Debian's chromium; skipped with the reason
when it is absent, unless REQUIRE_CHROMIUM=1 as in .ci/run)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import replace

import pytest

from opscan.render.html import render_html
from opscan.report import Row
from opscan.verdict import Verdict

from helpers_graph import REL_ATTENTION, node_of, scanned
from helpers_report import report, row

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("REQUIRE_CHROMIUM") == "1"
WINDOW = (1280, 1400)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", f"--window-size={WINDOW[0]},{WINDOW[1]}"]


@pytest.fixture(scope="module")
def page() -> str:
    return render_html(scanned(REL_ATTENTION))


def test_nothing_is_fetched_when_the_page_is_viewed(page):
    refs = re.findall(r'\b(?:src|href|xlink:href|action)\s*=\s*"([^"]*)"', page)
    assert all(r.startswith("#") for r in refs), refs
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"<script[^>]+src", page)


def test_each_finding_is_drawn_with_its_call_highlighted(page):
    focus = node_of(scanned(REL_ATTENTION), "aten::take")
    svgs = re.findall(r'<svg class="graph".*?</svg>', page, re.S)
    assert len(svgs) == 2  # take (forward) and put_ (backward)
    take = next(s for s in svgs if f'data-focus="{focus}"' in s)
    highlighted = re.findall(r'<g class="node call verdict-unsupported focus" data-id="(c\d+)"', take)
    assert highlighted == [focus]
    # radius 2 around take: its two sources (the table, rel_index), the score add it feeds, the other readers
    # of those sources (put_, AdamW's mul_ on the table), and add's neighbours (_unsafe_view, _softmax,
    # isneginf): 9 nodes, take included, in the one module block.attn
    assert len(re.findall(r'<g class="node ', take)) == 9 == int(re.search(r'data-nodes="(\d+)"', take)[1])
    assert re.findall(r'<g class="lane" data-module="([^"]*)"', take) == ["block.attn"]
    assert 'class="edge kind-parameter crossing"' in take  # the table is copied to the host


def test_sections_the_issue_asks_for(page):
    for section in ("summary", "findings", "transfers", "modules", "ops", "environment"):
        assert f'<section id="{section}">' in page
    assert '<span class="lane lane-dual-track">dual-track</span>' in page
    assert "saves 1.0 KB and 1 syncs" in page
    assert '<li data-module="block.attn"><span class="dot" style="background:var(--unsupported)">' in page


def test_a_7b_sized_report_stays_small():
    rows = tuple(row(f"aten::op{i}", ["float32"], Verdict.UNSUPPORTED if i % 3 else Verdict.NATIVE,
                     [f"model.layers.{i % 32}.mlp"], text="x" * 300, remedy="y" * 150) for i in range(400))
    nodes = [{"id": f"c{i}", "kind": "call", "label": "aten::linear", "verdict": "native", "dtypes": "bfloat16×3",
              "module": f"model.layers.{i % 4}.self_attn", "phase": "forward", "pos": i, "d2h_bytes": 0,
              "h2d_bytes": 0, "syncs": 0} for i in range(24)]
    edges = [{"source": f"c{i}", "target": f"c{i + 1}", "bytes": 1 << 24, "kind": "activation"} for i in range(23)]
    graph = {"neighbourhoods": [{"row": i, "focus": "c3", "nodes": nodes, "edges": edges} for i in range(40)]}
    modules = tuple((f"model.layers.{i}.{m}", "LlamaDecoderLayer") for i in range(32)
                    for m in ("", "self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                              "self_attn.o_proj", "mlp", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    size = len(render_html(replace(report(rows=rows), graph=graph, modules=modules)).encode())
    assert size < 5_000_000


def test_a_report_without_findings_or_graph_renders():
    native: tuple[Row, ...] = tuple(r for r in report().rows if r.verdict == Verdict.NATIVE)
    page = render_html(report(rows=native))
    assert "All 2 rows are native" in page and '<section id="transfers">' not in page


def chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if REQUIRED:
            pytest.fail("chromium is required here (REQUIRE_CHROMIUM=1) but not installed")
        pytest.skip("chromium is not installed (apt-get install chromium): the browser checks need it")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120)


def dump_dom(tmp_path, html: str):
    path = tmp_path / "report.html"
    path.write_text(html, encoding="utf-8")
    done = chromium(tmp_path, "--dump-dom", path.as_uri())
    return done.stdout, done.stderr


def test_the_browser_catches_errors_in_a_broken_page(tmp_path, page):
    broken = page.replace('<section><ul id="opscan-errors">', "<script>noSuchFunction();</script>"
                          '<section><ul id="opscan-errors">')
    dom, err = dump_dom(tmp_path, broken)
    assert 'data-js-errors="1"' in dom and "noSuchFunction is not defined" in dom
    assert "CONSOLE" in err  # the negative control for the check below


def test_the_browser_runs_the_page_without_errors_and_finds_the_highlighted_call(tmp_path, page):
    dom, err = dump_dom(tmp_path, page)
    assert 'data-ready="true"' in dom, err[-2000:]
    assert 'data-js-errors="' not in dom and '<ul id="opscan-errors"></ul>' in dom
    assert not [line for line in err.splitlines() if "CONSOLE" in line]
    focus = node_of(scanned(REL_ATTENTION), "aten::take")
    assert re.search(rf'<g class="node call verdict-unsupported focus" data-id="{focus}" '
                     r'data-verdict="unsupported" data-focus="true"', dom)
    assert 'data-graphs="2"' in dom


def test_the_drawn_graph_is_not_blank(tmp_path, page):
    dom, _ = dump_dom(tmp_path, page)
    x, y, w, h = map(int, re.search(r'data-first-graph="([\d,]+)"', dom)[1].split(","))
    assert w > 200 and h > 100 and y + h <= WINDOW[1]
    shot = tmp_path / "shot.png"  # at half scale: a quarter of the pixels to decode in pure Python
    chromium(tmp_path, "--force-device-scale-factor=0.5", f"--screenshot={shot}", (tmp_path / "report.html").as_uri())
    x, y, w, h = x // 2, y // 2, w // 2, h // 2
    width, pixels = read_png(shot.read_bytes(), rows=y + h)
    assert width == WINDOW[0] // 2
    inside = [pixels[r][c] for r in range(y, y + h) for c in range(x, x + w)]
    background = max(set(inside), key=inside.count)
    drawn = sum(1 for p in inside if p != background) / len(inside)
    assert drawn > 0.05 and len(set(inside)) > 20  # nodes, text and edges in several colours
    reds = sum(1 for r, g, b in inside if r > 180 and g < 80 and b < 80)
    assert reds > 20  # the highlighted call's red outline


def read_png(data: bytes, rows: int) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """A minimal decoder for the 8-bit RGB/RGBA PNGs chromium writes: the first `rows` rows as RGB."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, prev, out = zlib.decompress(idat), width * channels, bytearray(width * channels), []
    for r in range(min(rows, height)):
        kind, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        _unfilter(kind, line, prev, channels)
        out.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        prev = line
    return width, out


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((x + y) & 255 for x, y in zip(line, prev))
        return
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
        if kind == 1:
            line[i] = (line[i] + a) & 255
        elif kind == 2:
            line[i] = (line[i] + b) & 255
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
