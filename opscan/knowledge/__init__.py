"""Knowledge stage: everything opscan knows about MPS support, gathered into one immutable object.

`load_knowledge()` reads, without importing torch:

* native_functions.yaml of the installed torch wheel (`torchgen/packaged/ATen/native/`), or a
  given copy: which overloads have MPS kernels and which are composite (yaml_index.py);
* facts.yaml: the always-CPU list, error stubs, Python registrations, minimum macOS, the
  distributed rule and shape-predictable kernel errors, per release series (facts.py);
* torchvision.yaml: torchvision ops with MPS kernels (facts.py);
* common_mps.py of the installed wheel: complex-supported and unimplemented OpInfo lists
  (common_mps.py), when the wheel ships it (2.8.0 and later).

`release` is the torch release the prediction is for (default: the installed one). The yaml and
common_mps.py always come from the installed wheel unless a yaml path is given, so predicting for
another release than the installed one mixes sources; `Knowledge.yaml_release` says which.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from opscan.errors import OpscanError
from opscan.knowledge.common_mps import CommonMps, installed_path, load_common_mps
from opscan.knowledge.facts import (
    FACTS_PATH,
    TORCHVISION_PATH,
    Facts,
    ReleaseFacts,
    TorchvisionOp,
    load_facts,
    load_torchvision,
)
from opscan.knowledge.yaml_index import YamlIndex, load_yaml_index
from opscan.opkey import OpKey

YAML_RELATIVE = os.path.join("packaged", "ATen", "native", "native_functions.yaml")

__all__ = ["Knowledge", "KnowledgeError", "load_knowledge", "installed_release", "default_yaml_path"]


class KnowledgeError(OpscanError):
    """The knowledge base cannot be built: no torch installed, a missing yaml, an unknown release."""


@dataclass(frozen=True, eq=False)
class Knowledge:
    """The immutable knowledge base that `opscan.classify.predict` reads."""

    release: str  # torch release predicted for, e.g. "2.14.1"
    yaml: YamlIndex
    yaml_release: str | None  # release of the wheel the yaml came from; None for a given path
    facts: ReleaseFacts = field(repr=False)
    all_facts: Facts = field(repr=False)
    torchvision: Mapping[OpKey, TorchvisionOp] = field(repr=False)
    common_mps: CommonMps | None = field(repr=False)  # None when the wheel lacks common_mps.py
    installed_release: str | None = None  # the wheel common_mps.py (and the default yaml) came from
    kb_version: str = ""

    @property
    def yaml_source(self) -> str:
        """Where the yaml facts come from, for Evidence.source."""
        if self.yaml_release is not None:
            return f"native_functions.yaml (torch {self.yaml_release} wheel)"
        return f"native_functions.yaml ({self.yaml.path})"

    def cia_with_mps(self) -> tuple[OpKey, ...]:
        """Overloads with both CompositeImplicitAutograd and an MPS kernel (see yaml_index)."""
        return self.yaml.cia_with_mps()


def installed_release() -> str | None:
    """The installed torch's version without its local suffix ("2.14.1+cu130" -> "2.14.1"),
    read from the package metadata (torch is not imported); None when torch is not installed."""
    try:
        return importlib.metadata.version("torch").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def default_yaml_path() -> str:
    """native_functions.yaml inside the installed torchgen package (torch wheels ship it)."""
    spec = importlib.util.find_spec("torchgen")
    for root in (spec and spec.submodule_search_locations) or ():
        candidate = os.path.join(root, YAML_RELATIVE)
        if os.path.isfile(candidate):
            return candidate
    raise KnowledgeError(
        "native_functions.yaml not found in the installed torchgen package: install a torch wheel "
        "or give the path of a native_functions.yaml"
    )


def _digest(*paths: str) -> str:
    """First 8 hex digits of the sha256 of the given files, concatenated."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:8]


def _common_mps() -> CommonMps | None:
    """The installed wheel's common_mps.py lists, or None when it does not ship the file."""
    path = installed_path()
    return load_common_mps(path) if path else None


def load_knowledge(yaml_path: str | None = None, release: str | None = None) -> Knowledge:
    """Build the knowledge base for `release` (default: the installed torch) from `yaml_path`
    (default: the installed wheel's native_functions.yaml). Cached: equal arguments return the
    same object. Raises KnowledgeError when a source is missing or the release is unknown."""
    return _load(os.path.abspath(yaml_path) if yaml_path else None, release)


@functools.lru_cache(maxsize=8)
def _load(yaml_path: str | None, release: str | None) -> Knowledge:
    """load_knowledge's cached body (arguments normalised)."""
    installed = installed_release()
    if not (release or installed):
        raise KnowledgeError("torch is not installed: install it, or name the release to predict for")
    release = str(release or installed).split("+", 1)[0]
    yaml_release = None if yaml_path else installed
    path = yaml_path or default_yaml_path()
    if not os.path.isfile(path):
        raise KnowledgeError(f"native_functions.yaml not found at {path}: check the path")
    all_facts = load_facts()
    try:
        facts = all_facts.for_release(release)
    except ValueError as exc:
        raise KnowledgeError(f"{exc}: predict for one of those releases") from exc
    index = load_yaml_index(path)
    version = (
        f"yaml:{yaml_release or 'custom'}:{index.sha256[:12]}"
        f"+facts:{all_facts.count}:{_digest(FACTS_PATH, TORCHVISION_PATH)}"
    )
    return Knowledge(
        release=release,
        yaml=index,
        yaml_release=yaml_release,
        facts=facts,
        all_facts=all_facts,
        torchvision=load_torchvision(),
        common_mps=_common_mps(),
        installed_release=installed,
        kb_version=version,
    )
