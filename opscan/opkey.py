"""Shared: `OpKey`, the one spelling of an operator overload used by every stage; `Release`, the one
reading of a torch release ("2.14.1", the series "2.14", a local build "2.14.1+cu130"); `ReleaseRange`, the one
reading of the releases a knowledge entry applies to; `parse_macos`, the one reading of a macOS version.

| where                        | spelling                                   |
|------------------------------|--------------------------------------------|
| JSON `op` + `overload`       | "aten::add", "Tensor" (default -> "default") |
| display / PyTorch error text | aten::add.Tensor, aten::relu (no suffix for default) |
| native_functions.yaml        | add.Tensor, relu                           |
| Python                       | torch.ops.aten.add.Tensor, str(func) == "aten.relu.default" |
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEFAULT = "default"
# the namespaces of torch's own operators: an op outside them is registered by the scanned code or another library
TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized", "_quantized", "rngprims", "_c10d_functional", "c10d"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class OpKey:
    """An operator overload: namespace, name and overload ("default" for the unnamed one)."""

    namespace: str
    name: str
    overload: str = DEFAULT

    def __post_init__(self) -> None:
        for part in (self.namespace, self.name, self.overload):
            if not _NAME.match(part):
                raise ValueError(f"not a valid operator name part: {part!r} in {self!r}")

    @property
    def op(self) -> str:
        """JSON `op` field: "aten::name"."""
        return f"{self.namespace}::{self.name}"

    @property
    def display(self) -> str:
        """PyTorch's own spelling: "aten::name.overload", no suffix for the default overload."""
        return self.op if self.overload == DEFAULT else f"{self.op}.{self.overload}"

    @property
    def yaml_name(self) -> str:
        """native_functions.yaml spelling: "name.overload" or "name"."""
        return self.name if self.overload == DEFAULT else f"{self.name}.{self.overload}"

    @property
    def python(self) -> str:
        """Python attribute path: "torch.ops.aten.name.overload"."""
        return f"torch.ops.{self.namespace}.{self.name}.{self.overload}"

    def __str__(self) -> str:
        return self.display

    @classmethod
    def from_json(cls, op: str, overload: str) -> OpKey:
        """Build from the report's `op` ("aten::x") and `overload` fields."""
        namespace, sep, name = op.partition("::")
        if not sep:
            raise ValueError(f"op field must look like 'namespace::name', got {op!r}")
        return cls(namespace, name, overload or DEFAULT)

    @classmethod
    def from_yaml(cls, func_name: str, namespace: str = "aten") -> OpKey:
        """Build from a yaml `func:` name such as "add.Tensor" or "relu"."""
        name, _, overload = func_name.partition(".")
        return cls(namespace, name, overload or DEFAULT)

    @classmethod
    def parse(cls, text: str) -> OpKey:
        """Parse any spelling: "aten::add.Tensor", "aten.add.Tensor", "torch.ops.aten.add.Tensor",
        "aten::relu" (default overload) or a bare yaml name "add.Tensor" (namespace aten)."""
        text = text.strip()
        if text.startswith("torch.ops."):
            text = text[len("torch.ops."):]
        if "::" in text:
            namespace, _, rest = text.partition("::")
            name, _, overload = rest.partition(".")
            return cls(namespace, name, overload or DEFAULT)
        parts = text.split(".")
        if len(parts) == 3:
            return cls(parts[0], parts[1], parts[2])
        return cls.from_yaml(text)

    @classmethod
    def of(cls, func: object) -> OpKey:
        """Build from a torch OpOverload (anything whose str() is "ns.name.overload")."""
        namespace, name, overload = str(func).split(".")
        return cls(namespace, name, overload)


def signature_text(dtypes: tuple[str, ...]) -> str:
    """A dtype signature in short but lossless form: ("float32", "float32", "int64") -> "float32×2,int64".

    Rows are keyed by the whole signature, so two rows of one op must never print alike.
    """
    runs: list[list] = []
    for dtype in dtypes:
        if runs and runs[-1][0] == dtype:
            runs[-1][1] += 1
        else:
            runs.append([dtype, 1])
    return ",".join(d if n == 1 else f"{d}×{n}" for d, n in runs) or "-"


@dataclass(frozen=True, order=True)
class Release:
    """A torch release: ordered and compared by its numbers; a local suffix ("+cu130") is kept for printing only.

    `Release.parse` is the one parser of release text (ValueError for anything else); `drop_local` the one place
    that strips the suffix from text that may not be a release at all (an installed dev build's version)."""

    numbers: tuple[int, ...]
    local: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> Release:
        """"2.14.1" / "2.14" / "2.14.1+cu130"; ValueError unless it is at least major.minor, all digits."""
        plain, _, local = str(text).partition("+")
        parts = plain.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a torch release: {text!r}")
        return cls(tuple(int(p) for p in parts), local)

    @staticmethod
    def drop_local(text: str) -> str:
        """`text` without its local suffix: "2.14.1+cu130" -> "2.14.1" (anything else unchanged)."""
        return text.split("+", 1)[0]

    @property
    def plain(self) -> str:
        """The release without its local suffix: "2.14.1"."""
        return ".".join(map(str, self.numbers))

    @property
    def series(self) -> str:
        """Its release series: "2.14"."""
        return f"{self.numbers[0]}.{self.numbers[1]}"

    @property
    def series_key(self) -> tuple[int, int]:
        """Its series as numbers, for ordering series: (2, 14)."""
        return self.numbers[0], self.numbers[1]

    def __str__(self) -> str:
        return self.plain + (f"+{self.local}" if self.local else "")


@dataclass(frozen=True)
class ReleaseRange:
    """The releases a knowledge entry applies to: spans from a first to a last release, both inclusive. An end
    spelled as a series reaches, as the last, every patch release of it ("2.8": up to 2.8.x) and starts, as the
    first, at its first one.

    `ReleaseRange.parse` reads the knowledge files' spellings: "2.5.0..2.8.0" (expectation_conditions.yaml,
    composite_paths.yaml), one release or series, and a list of those (kernel_rules.yaml's `releases`:
    ["2.3.1", "2.4"] is 2.3.1 and every 2.4.x); `between(first, last)` builds silent_bugs.yaml's `affected` pair.
    A malformed one is a ValueError."""

    spans: tuple[tuple[Release, Release], ...]

    def __post_init__(self) -> None:
        if not self.spans:
            raise ValueError("an empty release range")

    @classmethod
    def parse(cls, value, *, series: bool = False) -> ReleaseRange:
        """"A..B", "A" or a list of those (`series`: every end must be a series "X.Y")."""
        items = value if isinstance(value, (list, tuple)) else [value]
        spans = []
        for item in items:
            first, dots, last = str(item).partition("..")
            spans += cls.between(first, last if dots else first, series=series).spans
        return cls(tuple(spans))

    @classmethod
    def between(cls, first: str, last: str, *, series: bool = False) -> ReleaseRange:
        """The releases from `first` to `last` (each "X.Y" or "X.Y.Z"); ValueError when `last` comes before."""
        low, high = _range_end(first, series), _range_end(last, series)
        if not _at_most(low, high):
            raise ValueError(f"release range {first}..{last} ends before it starts")
        return cls(((low, high),))

    def covers(self, release: str | Release) -> bool:
        """Whether `release` is in the range."""
        r = release if isinstance(release, Release) else Release.parse(release)
        return any(low <= r and _at_most(r, high) for low, high in self.spans)

    @property
    def first(self) -> Release:
        """The earliest release the range starts at."""
        return min(low for low, _ in self.spans)

    def __str__(self) -> str:
        return ", ".join(str(a) if a == b and len(a.numbers) == len(b.numbers) else f"{a}..{b}"
                         for a, b in self.spans)


def _range_end(text: str, series: bool) -> Release:
    release = Release.parse(str(text).strip())
    if release.local or len(release.numbers) not in ((2,) if series else (2, 3)):
        raise ValueError(f"not a series: {text!r}" if series else f"not a release or series: {text!r}")
    return release


def _at_most(release: Release, last: Release) -> bool:
    """`release` <= `last`, a series `last` taking in every patch release of it."""
    return release.series_key <= last.numbers if len(last.numbers) == 2 else release.numbers <= last.numbers


Macos = tuple[int, int]


def parse_macos(text: str) -> Macos:
    """"14.4" / "15" -> (14, 4) / (15, 0); ValueError otherwise."""
    major, _, minor = str(text).strip().partition(".")
    if not major.isdigit() or not (minor or "0").isdigit():
        raise ValueError(f"not a macOS version: {text!r}")
    return int(major), int(minor or 0)


def macos_text(version: Macos) -> str:
    """(14, 4) -> "14.4"."""
    return ".".join(map(str, version))
