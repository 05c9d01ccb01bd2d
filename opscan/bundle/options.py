"""Bundle: the scan options a bundle's manifest stores (`manifest["scan"]`), as JSON data and back.

`opscan bundle` stores the options it traced with; `opscan merge` scans again with them. Factory arguments are
stored as their reprs and read back with ast.literal_eval (never eval); `probe` and `live` are the run's, not the
scan's, and are left out.
"""

from __future__ import annotations

import ast
from typing import Any

from opscan.errors import UsageError

DATA_FIELDS = ("target", "inference", "dtype", "fx", "yaml_path", "fake", "auto_fake", "torch_version", "macos",
               "memory", "repro")
LATER_FIELDS = ("chip",)  # stored since issue 26's --chip; a record made before it reads as not given (None)


def options_to_data(options) -> dict[str, Any]:
    """A ScanOptions as the manifest's JSON data."""
    data = {name: getattr(options, name) for name in DATA_FIELDS + LATER_FIELDS}
    data["inputs"] = list(options.inputs)
    data["args"] = {key: _literal_repr(key, value) for key, value in options.args.items()}
    data["public_args"] = list(options.public_args)
    return data


def options_from_data(data: dict[str, Any], **overrides: Any):
    """The ScanOptions `options_to_data` stored, with `overrides` (probe options, a moved target) applied."""
    from opscan.scan import ScanOptions

    fields = {name: data[name] for name in DATA_FIELDS}
    fields.update({name: data.get(name) for name in LATER_FIELDS})
    fields["inputs"] = tuple(data["inputs"])
    fields["args"] = {key: ast.literal_eval(text) for key, text in data["args"].items()}
    fields["public_args"] = tuple(data.get("public_args") or ())  # a record made before --public-arg: none
    return ScanOptions(**{**fields, **overrides})


def _literal_repr(key: str, value: Any) -> str:
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise UsageError(f"--arg {key}: {text} cannot be stored as a Python literal — pass a value "
                         "ast.literal_eval reads back (numbers, strings, tuples, lists, dicts)")
    return text
