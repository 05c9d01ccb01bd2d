"""Knowledge stage: conditions on common_mps.py expectations (`expectation_conditions.yaml`), where the entry's
own comment states which form of the call fails (bincount's float64 output is its weighted form's).

`conditions_for(list, opinfo, release)` gives the Condition records that apply in a release; `holds(condition,
dtypes)` evaluates one on a call's input dtypes (None when it cannot be decided). The comment each condition
quotes is the entry's `note` record in the release's knowledge (sources.py), so the data keeps its source.
No torch import.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass

import yaml

from opscan.knowledge.conditions import compile_when, evaluate_when
from opscan.knowledge.schema import derived, entry_values
from opscan.opkey import ReleaseRange

CONDITIONS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "expectation_conditions.yaml")


@dataclass(frozen=True)
class Condition:
    """One entry's condition, with the comment it comes from."""

    list: str
    opinfo: str
    releases: ReleaseRange
    comment: str
    when: str
    means: str
    source: str
    code: ast.Expression = derived()


@functools.lru_cache(maxsize=2)
def load_conditions(path: str = CONDITIONS_PATH) -> tuple[Condition, ...]:
    """The shipped conditions (ValueError on a malformed entry)."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    out = []
    for item in raw.get("conditions", ()):
        values = entry_values(Condition, item, "expectation_conditions.yaml", "condition",
                              releases=ReleaseRange.parse, means=lambda text: " ".join(str(text).split()))
        out.append(Condition(**values, code=compile_when(values["when"])))
    return tuple(out)


def conditions_for(list_name: str, opinfo: str, release: str) -> tuple[Condition, ...]:
    """The conditions of one list entry that apply in `release`."""
    return tuple(c for c in load_conditions()
                 if c.list == list_name and c.opinfo == opinfo and c.releases.covers(release))


def holds(condition: Condition, dtypes: tuple[str, ...] | None, macos: tuple[int, int] = (0, 0)) -> bool | None:
    """Whether a call with these input dtypes meets the condition (None: no dtypes, undecided)."""
    if dtypes is None:
        return None
    return evaluate_when(condition, {"dtypes": tuple(dtypes)}, macos)
