"""Spine: the escapers every writer uses for text it did not make itself (module and op names, exception texts
from a Mac, model names and titles of a zoo manifest, a report's fields). One per output kind (issue 36):

- terminal (the table, stderr lines): `printable` — no control character (C0 with ESC, so no escape sequence;
  DEL, C1) and no bidirectional override, written as visible `\\x1b`/`\\u202e` escapes; `newlines=False` for
  every field of a line: one line, so no text starts a line of its own (a GitHub workflow command `::error ...`
  included); `inert_commands` on the whole table: no line starts (after blanks) with `::`, wherever a cell folded;
- Markdown outside fences (ISSUE.md's title, sentences, table cells): `markdown_text` — one code span, where
  nothing is HTML, a link, a mention, emphasis or a heading, on one line, with no `|` that ends a table cell;
  `inline_code` for the inside of a span; `comment_text` inside a comment (no `--`: it cannot end early);
- HTML: `html_text` — `&<>"'` as references, control characters escaped, line breaks as `&#10;`; a `<script>`
  data block: `script_json` (strict JSON, `<`, `>`, `&`, U+2028/9 as `\\uXXXX`: no `</script>`, `<!--`, `-->`);
- XML (GraphML, JUnit): `xml_text` — the characters XML 1.0 forbids as visible escapes (ElementTree the rest);
- CSV: `csv_cell` — a cell that starts with `=`, `+`, `-`, `@`, a tab or a CR gets a leading `'` (a spreadsheet
  shows it as text instead of running it as a formula);
- SARIF: `sarif_text` — one line, no control character; the log is `strict_json`;
- GitHub workflow commands: `github_data` (message), `github_property` (`file=`, `title=`) — as the Actions
  toolkit escapes: `%`, CR, LF, properties also `:` and `,`; control characters visible;
- JSON (every JSON file and stdout): `strict_json` — RFC 8259: a non-finite float (NaN, ±inf) is null, never
  `NaN` or `Infinity`.
- `ascii_text`: the console when stdout cannot encode what opscan prints (PYTHONIOENCODING=ascii, LC_ALL=C):
  the few typographic characters opscan uses get ASCII spellings, anything else a backslash escape.
"""

from __future__ import annotations

import html
import json
import math
import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]")
_CONTROL_NO_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "]")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
ASCII = {"·": "-", "—": "--", "–": "-", "…": "...", "×": "x", "→": "->", "←": "<-", "↔": "<->", "≠": "!=",
         "≤": "<=", "≥": ">=", "✓": "ok", "✗": "x", "•": "*", "‘": "'", "’": "'", "“": '"', "”": '"', "│": "|",
         "─": "-", "┃": "|", "━": "-", "█": "#", "░": ".", "▏": "|", "🐛": "(bug)"}
_ASCII_TABLE = str.maketrans(ASCII)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, newlines: bool = True) -> str:
    """`text` safe to print on a terminal (see the module docstring); `newlines=False`: one line (\\n, \\t, \\r
    escaped too)."""
    if not isinstance(text, str):
        text = str(text)
    return (_CONTROL if newlines else _CONTROL_NO_NEWLINE).sub(_escape, text)


def ascii_text(text: str) -> str:
    """`text` in ASCII: opscan's typographic characters spelled out, anything else backslash-escaped."""
    return text.translate(_ASCII_TABLE).encode("ascii", "backslashreplace").decode("ascii")


def encodable(text: str, encoding: str | None) -> bool:
    """Whether `text` can be written to a stream of `encoding` as it is."""
    try:
        text.encode(encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def xml_text(text: object) -> str:
    """`text` with the characters XML 1.0 forbids written as visible escapes (escape <, &, quotes after this)."""
    if not isinstance(text, str):
        text = str(text)
    return _NOT_XML.sub(_escape, text)


def script_json(value, **dumps) -> str:
    """`strict_json(value, **dumps)` that is safe inside an HTML <script> element (see the module docstring)."""
    text = strict_json(value, **dumps)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def csv_cell(value):
    """A CSV cell that a spreadsheet shows as text (see the module docstring); non-text values unchanged."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def comment_text(text: object) -> str:
    """`text` for the inside of an HTML comment (Markdown's too): it cannot end the comment early."""
    text = printable(text, newlines=False).replace("<!", "<\u2010!")
    while "--" in text:
        text = text.replace("--", "-\u2010")
    return "\u2010" + text[1:] if text.startswith((">", "-")) else text


def inline_code(text: object) -> str:
    """`text` for one Markdown code span: backticks become ', line breaks escapes and `|` is escaped (in a table
    row GitHub ends a cell at a `|`, even inside a code span)."""
    return printable(text, newlines=False).replace("`", "'").replace("|", "\\|")


def markdown_text(text: object) -> str:
    """`text` for Markdown outside a code fence (a title, a table cell, a sentence): one code span, where nothing
    is HTML, a link, a mention, emphasis or a heading."""
    inner = inline_code(text)
    return f"`{inner}`" if inner.strip() else "` `"


def html_text(text: object) -> str:
    """`text` for HTML text or a quoted attribute value (see the module docstring)."""
    return html.escape(printable(text), quote=True).replace("\n", "&#10;")


def sarif_text(text: object) -> str:
    """`text` for a SARIF message or property: one line, no control character."""
    return printable(text, newlines=False)


def github_data(text: object) -> str:
    """`text` as a GitHub workflow command's message: it cannot end the command early or start another."""
    text = text if isinstance(text, str) else str(text)
    return printable(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def github_property(text: object) -> str:
    """`text` as a GitHub workflow command's property value (`file=`, `title=`): `:` and `,` escaped too."""
    return github_data(text).replace(":", "%3A").replace(",", "%2C")


_COMMAND_LINE = re.compile(r"^([ \t]*)::", re.MULTILINE)


def inert_commands(text: str) -> str:
    """Terminal output in which no line starts (after blanks) with `::`, as a GitHub workflow command does: a
    table cell folded at `::` (an op name, a crafted module name) gets a backslash before it."""
    return _COMMAND_LINE.sub(lambda m: m.group(1) + "\\::", text)


def finite(value):
    """`value` (JSON-like) with every non-finite float (NaN, ±inf) replaced by None (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def strict_json(value, **dumps) -> str:
    """`json.dumps(value, **dumps)` that is RFC 8259 JSON: a non-finite float is null (never NaN or Infinity);
    the value is walked only when it holds one."""
    try:
        return json.dumps(value, allow_nan=False, **dumps)
    except ValueError:
        return json.dumps(finite(value), allow_nan=False, **dumps)
