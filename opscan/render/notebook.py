"""Render stage: the report inside a Jupyter notebook.

`notebook_html(report)` is an HTML fragment for a notebook's output cell: the header line, the verdicts and the
lane with its reasons, each finding with its evidence and its neighbourhood drawn (the HTML page's own sections,
render/html.py and render/svg.py), and the op table folded away. It carries no script (Jupyter drops scripts from
untrusted notebooks) and nothing fetched, and its stylesheet is the page's scoped to its own box, so the notebook
around it keeps its look. `NotebookReport` is a Report that shows itself that way (`_repr_html_`): what
`opscan.analyze` returns. It lives here, not in the report stage, because that stage comes before rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from opscan.trust.text import html_text as escape

from opscan.render.html import html_sections, render_html
from opscan.render.html_assets import STYLE
from opscan.report import Report

SCOPE = "opscan-report"  # the class of the fragment's box; every rule of its stylesheet is scoped to it
_PAGE_LEVEL = {":root", "body", "html"}
# the box's own frame, and its headings and text kept from the notebook's styles (a notebook styles h2, table, ...)
OWN_STYLE = """
body { border: 1px solid #d8dde3; border-radius: 6px; }
h1, h2, h3, p, li, td, th, summary { color: #1d232a; font-family: inherit; }
"""


def scoped_css(css: str, scope: str = SCOPE) -> str:
    """`css` (flat rules, no at-rules) with every selector inside `.scope` (the page-level ones on it)."""
    rules = []
    for chunk in css.split("}"):
        selectors, brace, body = chunk.partition("{")
        if not brace:
            continue
        scoped = [f".{scope}" if s.strip() in _PAGE_LEVEL else f".{scope} {s.strip()}"
                  for s in selectors.split(",") if s.strip()]
        rules.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(rules)


def notebook_html(report: Report) -> str:
    """The report as a notebook output (see the module docstring)."""
    header, summary, findings = html_sections(report, ("header", "summary", "findings"))
    ops = html_sections(report, ("ops",), filter_box=False)[0]
    return (f'<div class="{SCOPE}" data-lane="{escape(report.lane.name)}" data-findings="{len(report.findings)}">'
            f"<style>{scoped_css(STYLE + OWN_STYLE)}</style>"
            f"{header}{summary}{findings}<section><details><summary>All {len(report.rows)} rows</summary>{ops}"
            "</details></section></div>")


@dataclass(frozen=True, repr=False)
class NotebookReport(Report):
    """A Report that renders itself in Jupyter (`_repr_html_`) and as the HTML page (`to_html`); the same data,
    field for field (`NotebookReport.of(report)` wraps one)."""

    @classmethod
    def of(cls, report: Report) -> NotebookReport:
        """`report` as a NotebookReport (the same field values, nothing copied)."""
        return cls(**{f.name: getattr(report, f.name) for f in fields(Report)})

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def to_html(self) -> str:
        """The self-contained HTML page (the CLI's report.html)."""
        return render_html(self)
