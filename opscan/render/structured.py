"""Render stage: the report JSON and YAML (one dict, two serialisers)."""

from __future__ import annotations

import yaml

from opscan.report import Report


def render_json(report: Report, **_) -> str:
    """The report as indented JSON (schema v3)."""
    return report.to_json(indent=2) + "\n"


def render_yaml(report: Report, ascii_only: bool = False, **_) -> str:
    """The same dict as YAML, keys in schema order; read it back with yaml.safe_load (`ascii_only`: every other
    character as a YAML escape, for a stdout that cannot encode it). No text is folded over lines and a text with
    a line break is double-quoted (`\\n`): a value never starts a line of its own (a GitHub workflow command in a
    CI log)."""
    return yaml.dump(report.to_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=not ascii_only,
                     width=1 << 30)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml when present: same text, ~8x faster
    """yaml's safe dumper, with every text holding a line break written double-quoted on one line."""


def _text(dumper, data: str):
    style = '"' if any(c in data for c in "\n\r\x85\u2028\u2029") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _text)
