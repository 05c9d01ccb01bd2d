"""Repro stage: what an ISSUE.md says of the cause it is about, beyond the op (repro/issue.py writes the rest). Pure.

- "Called from": the lines of the scanned code that caused the calls — the cause's sites with their source text
  (report/findings.py), else the rows' `where` (a report written before schema 4) — paths relative to the project,
  a path still absolute after redaction cut to its file name;
- the other ops the same line makes under the same rule;
- for a draft of a cause opscan would not file (`opscan repro --draft`): why, and the links to follow instead.

Text from the report only appears as code spans (opscan/trust/text.py `inline_code`, `markdown_text`): nothing ends
the line early, and no HTML, link, mention or heading can be injected.
"""

from __future__ import annotations

from opscan.trust.text import inline_code, markdown_text


def called_from(report: dict, findings: list[dict]) -> str:
    """"Called from": the lines of the user's code that made the findings' calls (the rows' `where`, paths relative to
    the project; a path still absolute after redaction is cut to its file name), "" when none is known."""
    rows = report.get("ops") if isinstance(report.get("ops"), list) else []  # a report opscan may not have written
    chosen = [rows[f["row"]] for f in findings if isinstance(f.get("row"), int) and 0 <= f["row"] < len(rows)]
    places = [p for r in chosen if isinstance(r, dict) and isinstance(r.get("where"), list)
              for p in r["where"] if _is_place(p)]
    lines = list(dict.fromkeys(_place_line(p) for p in places))
    if not lines:
        return ""
    return "Called from (the scanned code's lines that made these calls):\n\n" + "\n".join(lines) + "\n"


def _is_place(place) -> bool:
    """A `where` entry as opscan writes it (report/where.py): what else an edited report holds is left out."""
    if not isinstance(place, dict) or not isinstance(place.get("phases", []), list):
        return False
    via = place.get("via")
    return (place.get("file") is None or isinstance(place.get("file"), str)) and (
        via is None or isinstance(via, dict) and {"file", "line", "function"} <= set(via))


def _place_line(place: dict) -> str:
    def at(file, line, function) -> str:
        name = str(file).rsplit("/", 1)[-1] if str(file).startswith("/") else file
        return f"`{inline_code(f'{name}:{line}')}` in `{inline_code(function)}`"

    parts = [at(place["file"], place.get("line"), place.get("function"))] if place.get("file") else []
    if place.get("by") == "factory":
        parts[-1:] = [parts[-1] + ", the target's factory: opscan's default step ran its model"] if parts else []
    if place.get("via"):
        parts.append("via " + at(place["via"]["file"], place["via"]["line"], place["via"]["function"]))
    phases = f" ({inline_code(', '.join(map(str, place.get('phases'))))})" if place.get("phases") else ""
    return f"- {' · '.join(parts)}{phases}"


def not_for_filing(cause) -> str:
    """A draft of a cause opscan would not file (`opscan repro --draft`) opens with why, and where it belongs."""
    if cause is None or cause.upstream.get("issue"):
        return ""
    # the report's words (a report.json is read as untrusted data): each one code span
    links = "".join(f"\n> - {markdown_text(url)}" for url in cause.upstream.get("links") or [])
    return f"> **opscan would not file this as a new issue**: {markdown_text(cause.upstream.get('text'))}{links}\n"


def others(op: str, findings: list[dict]) -> str:
    """The other ops of the cause: the same line of the scanned code makes them too."""
    more = list(dict.fromkeys(str(f.get("op")) for f in findings if f.get("op") != op))
    if not more:
        return ""
    return (" The same line of the scanned code also makes " + ", ".join(markdown_text(o) for o in more)
            + ", judged by the same rule (its script is attached too).")


def cause_lines(cause) -> str:
    """"Called from": the lines of the user's code that caused the calls, with their source text."""
    lines = list(dict.fromkeys(_place_line(s) + (f": {markdown_text(s['text'])}" if s.get("text") else "")
                               for s in cause.sites if _is_place(s)))
    if not lines:
        return ""
    return "Called from (the scanned code's lines that made these calls):\n\n" + "\n".join(lines) + "\n"
