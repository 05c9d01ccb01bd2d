"""Render stage: pure functions Report -> str, one per output format.

`FORMATS` maps each `--format` name to its renderer; only the CLI writes files.
"""

from __future__ import annotations

from typing import Callable

from opscan.render.console import render_table
from opscan.render.github import render_github
from opscan.render.html import render_html
from opscan.render.junit import render_junit
from opscan.render.sarif import render_sarif
from opscan.render.structured import render_json, render_yaml

FORMATS: dict[str, Callable[..., str]] = {
    "table": render_table,
    "json": render_json,
    "yaml": render_yaml,
    "html": render_html,
    "junit": render_junit,
    "sarif": render_sarif,
    "github": render_github,
}

__all__ = ["FORMATS", "render_table", "render_json", "render_yaml", "render_html", "render_junit", "render_sarif",
           "render_github"]
