"""Report stage: a row's `where` — the lines of the user's code that made its calls (trace/frames.py), grouped.

Each call of the MPS view stands for a call of the CPU trace (its `index`), whose `CallSite` names the innermost frame
of the user's own code and the installed library's line below it (`via`). A row lists its distinct places in
step order, at most `MAX_PLACES`, each with the phases and the number of its calls made there:

    {"file": "examples/tricky.py", "line": 56, "function": "Tricky.forward", "by": "call",
     "phases": ["forward", "backward"], "calls": 2, "via": null,
     "text": "picked = torch.take(feats, self.picks)", "cell": null}

`file` is relative to the project folder (Target.project) when inside it; a library's `via` file is its path inside
site-packages. `by` "call": a line of the user's code that was running (a backward call's is the forward call that
made its autograd node); "factory": no line of the user's code made the call — opscan's default step ran the model,
its loss or its optimizer — so the target's factory stands in (the line of its `def`). A call with neither a user
frame nor a library frame (opscan's default step on a model from a module target) has no place. `text`: the source
line itself, stripped (as ruff and dynamo's user stack show it; null when it cannot be read), `cell`: the execution
count of the notebook cell the file is (`Cell In[cell], line L`, as IPython names it; null for a file). Pure data
but for the source line, read through linecache (which holds a notebook's cells too).
"""

from __future__ import annotations

import linecache
from typing import Any

from opscan.target.user_code import notebook_cell, relative_to

MAX_PLACES = 10
SOURCE_TEXT_MAX = 160  # characters of a source line kept


def places(calls, trace_calls, project: str | None) -> tuple[dict[str, Any], ...]:
    """The row's places: `calls` are its MPS-view calls, `trace_calls` the CPU trace's (indexed by `index`)."""
    found: dict[tuple, dict[str, Any]] = {}
    for call in calls:
        where = getattr(trace_calls[call.index], "where", None) if call.index < len(trace_calls) else None
        if where is None:
            continue
        by = "factory" if where.by == "factory" else "call"
        key = (where.file, where.line, where.function, where.via, by)
        entry = found.get(key)
        if entry is None:
            if len(found) == MAX_PLACES:
                continue
            entry = found[key] = place_entry(where, by, project)
        if call.phase not in entry["phases"]:
            entry["phases"].append(call.phase)
        entry["calls"] += 1
    return tuple(found.values())


def place_entry(where, by: str, project: str | None) -> dict[str, Any]:
    """A CallSite as a `where` entry (no phases or calls yet): the file relative to `project`, its source line and
    notebook cell."""
    via = where.via
    cell = notebook_cell(where.file) if where.file else None
    return {"file": relative_to(where.file, project) if where.file and cell is None else where.file,
            "line": where.line, "function": where.function, "by": by, "phases": [], "calls": 0,
            "via": {"file": via[0], "line": via[1], "function": via[2]} if via else None,
            "text": source_line(where.file, where.line), "cell": cell}


def source_line(file: str | None, line: int | None) -> str | None:
    """The source line `file`:`line`, stripped and cut to SOURCE_TEXT_MAX characters; None when it cannot be read."""
    if not file or not line:
        return None
    text = linecache.getline(file, line).strip()
    if not text:
        return None
    return text if len(text) <= SOURCE_TEXT_MAX else text[:SOURCE_TEXT_MAX - 1] + "…"


def at_text(place: dict[str, Any] | None) -> str:
    """"examples/tricky.py:56", or "Cell In[3], line 7" for a notebook cell; "" without a file."""
    if not place or not place.get("file"):
        return ""
    if place.get("cell") is not None:
        return f"Cell In[{place['cell']}], line {place['line']}"
    return f"{place['file']}:{place['line']}"


def place_text(place: dict[str, Any], via: bool = True) -> str:
    """"examples/tricky.py:56 in Tricky.forward · via transformers/…/modeling_bert.py:177 in BertSelfAttention.forward"
    (the factory said as such); "" for None."""
    if not place:
        return ""
    parts = []
    if place.get("file"):
        parts.append(f"{at_text(place)} in {place.get('function')}" + (
            ", whose model opscan's default step ran" if place.get("by") == "factory" else ""))
    if via and place.get("via"):
        v = place["via"]
        parts.append(f"via {v['file']}:{v['line']} in {v['function']}")
    return " · ".join(parts)


def short_place(place: dict[str, Any] | None) -> str:
    """"tricky.py:56", the file's name and line ("via modeling_bert.py:177" with only a library line)."""
    if not place:
        return ""
    if place.get("cell") is not None:
        return f"In[{place['cell']}]:{place['line']}"
    if place.get("file"):
        return f"{place['file'].rsplit('/', 1)[-1]}:{place['line']}"
    v = place.get("via") or {}
    return f"via {str(v.get('file', '')).rsplit('/', 1)[-1]}:{v.get('line')}" if v else ""


def short_places(places) -> str:
    """The first place, short, and how many more: "tricky.py:56 (+1)"."""
    first = short_place(places[0]) if places else ""
    return first + (f" (+{len(places) - 1})" if len(places) > 1 else "")
