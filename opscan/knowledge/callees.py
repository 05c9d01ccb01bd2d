"""Knowledge stage: what a composite overload calls in a release — the one question behind every composite
verdict that the trace cannot answer by itself (predict/composite.py judges the answer).

`callees(op, kb, how)` answers it from one source, with that source named (`Callees.source`):

| how | the source | what it says |
|---|---|---|
| AUTOGEN | the release's native_functions.yaml | an `autogen:` overload runs the overload it was generated from |
| DEVICE_BRANCH | facts.yaml `device_branches` | the ops its kernel dispatches for MPS input (whatever the CPU path) |
| PATHS | composite_paths.yaml `paths` | one path per branch of the release's C++ body, each with its condition |
| SPARSE | composite_paths.yaml `sparse_paths` | the branch its body takes for a sparse (COO) input |
| SAMPLES | composites.txt | the ops OpInfo samples saw it call, one path per sample (on the installed torch) |

composite_callees.txt (every op a release's kernel can call, any branch, read from its dylib) answers another
question, how a release's kernels differ from the installed torch's, for the MPS view (predict/release_paths.py):
its static sets list the sparse and quantized branches too, so they never judge a composite.

A path holds the ops it reaches (`Path.calls`) and, for PATHS, the condition over the op's arguments (their
schema names, bound by predict/bind.py) under which it runs. None: the source knows nothing of `op` in kb's
release. No torch import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from opscan.knowledge.composite_paths import Path, paths_for, sparse_paths_for
from opscan.knowledge.composites import load_composites
from opscan.opkey import OpKey

AUTOGEN, DEVICE_BRANCH, PATHS, SPARSE, SAMPLES = "autogen", "device-branch", "paths", "sparse-paths", "samples"


@dataclass(frozen=True)
class Callees:
    """What one composite calls in one release, as one source knows it."""

    how: str
    paths: tuple[Path, ...]  # the alternatives: each the ops it always reaches
    source: str
    labels: tuple[str, ...] = ()  # SAMPLES: the sample that showed each path ("softmax#0")
    release: str = ""  # SAMPLES: the torch release they were recorded on
    condition: str = ""  # DEVICE_BRANCH: when the kernel takes the MPS branch


def callees(op: OpKey, kb, how: str) -> Callees | None:
    """What `op` calls in kb's release according to source `how` (see the module docstring), or None."""
    return _SOURCES[how](op, kb)


def _autogen(op: OpKey, kb) -> Callees | None:
    entry = kb.yaml.get(op)
    if entry is None or entry.autogen_from is None:
        return None
    return Callees(AUTOGEN, (Path((entry.autogen_from.yaml_name,)),), kb.yaml_source)


def _device_branch(op: OpKey, kb) -> Callees | None:
    branch = kb.facts.device_branches.get(op)
    if branch is None:
        return None
    return Callees(DEVICE_BRANCH, (Path(tuple(o.yaml_name for o in branch.runs)),), branch.source,
                   condition=branch.condition)


def _paths(op: OpKey, kb) -> Callees | None:
    entry = paths_for(op.yaml_name, kb.release) if op.namespace == "aten" else None
    return None if entry is None else Callees(PATHS, entry.paths, "composite_paths.yaml: " + entry.source)


def _sparse(op: OpKey, kb) -> Callees | None:
    entry = sparse_paths_for(op.yaml_name, kb.release) if op.namespace == "aten" else None
    return None if entry is None else Callees(SPARSE, entry.paths, "composite_paths.yaml: " + entry.source)


def _samples(op: OpKey, kb) -> Callees | None:
    recorded = load_composites()
    calls = recorded.calls.get(op.yaml_name, ()) if recorded is not None else ()
    if not calls:
        return None
    return Callees(SAMPLES, tuple(Path(c) for _, c in calls), recorded.source, labels=tuple(s for s, _ in calls),
                   release=recorded.release)


@functools.lru_cache(maxsize=1)
def recorded_source() -> str:
    """Where SAMPLES come from, also when composites.txt records nothing for an op (for evidence)."""
    recorded = load_composites()
    return recorded.source if recorded is not None else "composites.txt (absent)"


_SOURCES = {AUTOGEN: _autogen, DEVICE_BRANCH: _device_branch, PATHS: _paths, SPARSE: _sparse, SAMPLES: _samples}
