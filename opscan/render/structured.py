"""Render stage: the report JSON and YAML (one dict, two serialisers)."""

from __future__ import annotations

import yaml

from opscan.report import Report


def render_json(report: Report, **_) -> str:
    """The report as indented JSON (schema v3)."""
    return report.to_json(indent=2) + "\n"


def render_yaml(report: Report, ascii_only: bool = False, **_) -> str:
    """The same dict as YAML, keys in schema order; read it back with yaml.safe_load (`ascii_only`: every other
    character as a YAML escape, for a stdout that cannot encode it)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when present: same text, ~8x faster
    return yaml.dump(report.to_dict(), Dumper=dumper, sort_keys=False, allow_unicode=not ascii_only)
