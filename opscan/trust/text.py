"""Spine: the escapers every writer uses for text it did not make itself (module and op names, exception texts
from a Mac, model names and titles of a zoo manifest, a report's fields).

- `printable`: the console (table, stderr lines). Control characters — C0 (ESC included, so no terminal escape
  sequence: clear screen, window title, hyperlinks), DEL, C1 — and the bidirectional overrides are written as
  visible `\\x1b`/`\\u202e` escapes; newlines stay only where the caller keeps them.
- `ascii_text`: the console when stdout cannot encode what opscan prints (PYTHONIOENCODING=ascii, LC_ALL=C):
  the few typographic characters opscan uses get ASCII spellings, anything else a backslash escape.
- `xml_text`: characters XML 1.0 forbids (most C0 controls, lone surrogates, U+FFFE/U+FFFF) written as visible
  escapes, before the XML escaping itself.
- `script_json`: JSON for an HTML `<script>` data block: `<`, `>`, `&`, U+2028 and U+2029 as `\\uXXXX`, so no
  `</script>`, `<!--` or `-->` can appear in it.
- `csv_cell`: a cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'` (a
  spreadsheet then shows it as text instead of running it as a formula).
- `comment_text`: text inside an HTML/Markdown comment: no `--` (so no `-->`), no leading `>`.
- `inline_code`: text for one Markdown code span: no backtick, no line break.
"""

from __future__ import annotations

import json
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
    """`json.dumps(value, **dumps)` that is safe inside an HTML <script> element (see the module docstring)."""
    text = json.dumps(value, **dumps)
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
    """`text` for one Markdown code span: backticks become ' and line breaks escapes."""
    return printable(text, newlines=False).replace("`", "'")
