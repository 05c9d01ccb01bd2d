"""Knowledge stage: the one reader of a knowledge file's YAML entries, whose keys are the fields of the frozen
dataclass each entry becomes.

A field with a default may be left out; one made with `derived()` is computed on load (a `when`'s compiled
`code`) and may not be spelled; one made with `spelled(key)` is spelled `key` in the file; `index` keys
(facts.yaml's `releases`) say where an entry is filed and are allowed beside the fields; any other key is
refused, so a misspelt key fails on load instead of being ignored. A `source`, where an entry has one, must say
something. A bad entry is a ValueError naming the file, the kind of entry, its id and its missing and unknown
keys or the value refused (a bug in opscan, not user input). No torch import.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any

_DERIVED, _SPELLED = "opscan_derived", "opscan_spelled"


def derived(**kwargs: Any) -> Any:
    """A dataclass field computed on load, never spelled in the file (`dataclasses.field` arguments)."""
    return dataclasses.field(metadata={_DERIVED: True}, **kwargs)


def spelled(name: str, **kwargs: Any) -> Any:
    """A dataclass field the file spells `name` (a Python keyword such as `from`)."""
    return dataclasses.field(metadata={_SPELLED: name}, **kwargs)


def entry_keys(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """(required, allowed) keys of a `cls` entry: its fields less the derived ones, those without a default
    required."""
    required, allowed = _keys(cls)
    return frozenset(required), frozenset(allowed)


def _keys(cls: type) -> tuple[set[str], dict[str, str]]:
    """(required keys, key -> field name)."""
    fields = [f for f in dataclasses.fields(cls) if not f.metadata.get(_DERIVED)]
    allowed = {f.metadata.get(_SPELLED, f.name): f.name for f in fields}
    required = {key for key, name in allowed.items() if _no_default(next(f for f in fields if f.name == name))}
    return required, allowed


def _no_default(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def entry_values(cls: type, raw: Any, file: str, kind: str, *, index: Iterable[str] = (),
                 **read: Callable[[Any], Any]) -> dict[str, Any]:
    """The fields of a `cls` entry that `raw` spells, each value through `read[name]` when given: keyword
    arguments for `cls` less its derived fields. ValueError ("kernel_rules.yaml: bad size rule 'x' (missing
    ['source'], unknown [])") on a key set that does not match, an empty source or a value `read` refuses."""
    required, allowed = _keys(cls)
    name = raw.get("id", raw.get("op")) if isinstance(raw, dict) else raw
    bad = f"{file}: bad {kind} {name!r}"
    if not isinstance(raw, dict):
        raise ValueError(f"{bad} (not a mapping)")
    missing, unknown = required - set(raw), set(raw) - set(allowed) - set(index)
    if missing or unknown:
        raise ValueError(f"{bad} (missing {sorted(missing)}, unknown {sorted(unknown)})")
    if "source" in allowed and not str(raw.get("source", "-")).strip():
        raise ValueError(f"{bad} (an empty source)")
    try:
        return {allowed[key]: read[key](value) if key in read else value
                for key, value in raw.items() if key in allowed}
    except (TypeError, ValueError, re.error) as exc:
        raise ValueError(f"{bad}: {exc}") from None
