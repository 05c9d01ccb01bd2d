"""The zoo's unit of work: one model to scan (ZooModel), and the YAML manifest that names a user's own set.

A manifest (read by the one reader, opscan/trust/read.py: yaml.SafeLoader after its size, depth and alias
expansion are checked; bench/zoo.yaml is one):

    defaults: {mode: train}            # optional: keys every entry gets unless it sets them
    models:                            # a mapping name -> entry (or a list of entries with `name`)
      resnet18:
        target: torchvision.models:resnet18   # or `factory`; module:function or file.py:function
        args: {num_classes: 10}                # the factory's keyword arguments
        inputs: ["2x3x32x32:float32"]          # --input specs (none: the factory returns its inputs)
        mode: train                            # train | inference (or `training: true|false`)
        dtype: float16                         # optional, as --dtype
        fake: auto                             # auto | true | false: fake tensors (auto: try them, else real)

A relative file target (`bench/zoo_models.py:hf`) is made absolute: looked up from the current folder, then
from the manifest's folder and each folder above it. bench/zoo.yaml's bookkeeping keys (source, why, lane,
non_native, known_wrong, torch_version, domain, expected_before_run, expectation_fixed, known_wrong_rows,
known_missed_rows; the zoo covers every release, so torch_version is not used) are accepted. Anything else
is a ManifestError: one line naming the manifest, the model and the key (exit 2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscan.errors import UsageError

KEYS = {"name", "target", "factory", "args", "inputs", "mode", "training", "dtype", "fake", "source", "timeout"}
IGNORED = {"why", "lane", "non_native", "known_wrong", "torch_version",  # bench/zoo.py's, not the scan's
           "domain", "expected_before_run", "expectation_fixed", "known_wrong_rows", "known_missed_rows"}
DTYPES = ("float32", "float16", "bfloat16")


class ManifestError(UsageError):
    """A manifest that cannot be read: one line, exit 2."""


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: what to build, with which inputs, and which step (train or inference)."""

    name: str
    target: str
    args: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    inference: bool = False
    dtype: str | None = None
    fake: str = "auto"  # "auto" (fake tensors, real ones if the build fails under them), "true", "false"
    source: str = "manifest"  # the family or manifest it came from

    def to_dict(self) -> dict[str, Any]:
        """JSON form (what a worker receives and the leaderboard keeps)."""
        return {"name": self.name, "target": self.target, "args": self.args, "inputs": list(self.inputs),
                "mode": "inference" if self.inference else "train", "dtype": self.dtype, "fake": self.fake,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ZooModel":
        """The model to_dict wrote."""
        return cls(data["name"], data["target"], dict(data.get("args") or {}), tuple(data.get("inputs") or ()),
                   data.get("mode") == "inference", data.get("dtype"), data.get("fake", "auto"),
                   data.get("source", "manifest"))

    @property
    def key(self) -> str:
        """Name and a digest of the spec: a journal line counts as done only for the same model spec."""
        spec = json.dumps(self.to_dict(), sort_keys=True, default=repr)
        return f"{self.name}#{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def read_manifest(path: Path) -> tuple[ZooModel, ...]:
    """The models of the manifest at `path`, in its order (ManifestError on anything it cannot use)."""
    from opscan.trust.read import read_yaml

    data = read_yaml(path, "the manifest", "fix the manifest (docs/zoo.md), or pass a family name",
                     error=ManifestError)
    return parse_manifest(data, path)


def parse_manifest(data: Any, path: Path) -> tuple[ZooModel, ...]:
    """The models of an already-loaded manifest (`path` names it in errors and anchors relative targets)."""
    if not isinstance(data, dict) or "models" not in data:
        raise ManifestError(f"manifest {path}: expected a mapping with a `models:` key (see docs/zoo.md)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ManifestError(f"manifest {path}: `defaults` must be a mapping")
    entries = _entries(data["models"], path)
    if not entries:
        raise ManifestError(f"manifest {path}: `models` is empty")
    models = tuple(_model(name, {**defaults, **entry}, path) for name, entry in entries)
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ManifestError(f"manifest {path}: model names must be unique, repeated: {', '.join(twice)}")
    return models


def _entries(models: Any, path: Path) -> list[tuple[str, dict]]:
    if isinstance(models, dict):
        pairs = [(str(name), entry) for name, entry in models.items()]
    elif isinstance(models, list):
        pairs = [(str(e.get("name", "")) if isinstance(e, dict) else "", e) for e in models]
    else:
        raise ManifestError(f"manifest {path}: `models` must be a mapping of name -> entry or a list of entries")
    for i, (name, entry) in enumerate(pairs):
        if not isinstance(entry, dict):
            raise ManifestError(f"manifest {path}: model {name or i + 1}: expected a mapping, got {entry!r:.60}")
        if not name:
            raise ManifestError(f"manifest {path}: model {i + 1} has no `name`")
    return pairs


def _model(name: str, entry: dict, path: Path) -> ZooModel:
    def bad(what: str) -> ManifestError:
        return ManifestError(f"manifest {path}: model {name}: {what}")

    unknown = sorted(set(entry) - KEYS - IGNORED)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (keys: {', '.join(sorted(KEYS - {'name'}))})")
    target = entry.get("target", entry.get("factory"))
    if not isinstance(target, str) or ":" not in target:
        raise bad("`target` (or `factory`) must be 'module:function' or 'file.py:function'")
    args, inputs = entry.get("args") or {}, entry.get("inputs") or []
    if not isinstance(args, dict):
        raise bad("`args` must be a mapping of keyword -> value")
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise bad("`inputs` must be a list of 'SHAPE:DTYPE' strings")
    return ZooModel(name, _resolve(target, path), dict(args), tuple(inputs), _inference(entry, bad),
                    _dtype(entry, bad), _fake(entry, bad), str(entry.get("source", "manifest")))


def _inference(entry: dict, bad) -> bool:
    if "training" in entry:
        if not isinstance(entry["training"], bool):
            raise bad("`training` must be true or false")
        return not entry["training"]
    mode = entry.get("mode", "train")
    if mode not in ("train", "inference"):
        raise bad(f"`mode` must be train or inference, not {mode!r}")
    return mode == "inference"


def _dtype(entry: dict, bad) -> str | None:
    dtype = entry.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise bad(f"`dtype` must be one of {', '.join(DTYPES)}, not {dtype!r}")
    return dtype


def _fake(entry: dict, bad) -> str:
    fake = entry.get("fake", "auto")
    if fake not in ("auto", True, False):
        raise bad(f"`fake` must be auto, true or false, not {fake!r}")
    return fake if fake == "auto" else str(fake).lower()


def _resolve(target: str, manifest: Path) -> str:
    """A relative file target made absolute: found from the current folder, else from the manifest's folder or
    one above it (left as written when none has it: the scan then says it is missing)."""
    location, _, func = target.rpartition(":")
    if not location.endswith(".py") or Path(location).is_absolute():
        return target
    for folder in (Path.cwd(), manifest.resolve().parent, *manifest.resolve().parent.parents):
        if (folder / location).is_file():
            return f"{folder / location}:{func}"
    return target
