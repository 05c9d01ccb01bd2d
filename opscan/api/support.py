"""API: `supports(op, dtypes=..., release=..., macos=...)`, one operator's answer (what `opscan coverage` answers).

Without dtypes, the overload's dtype-free status exactly as `opscan coverage` gives it (predict/coverage.py: a
composite is judged by the ops it calls). With dtypes, the prediction for inputs of those dtypes
(predict/rules.py: float64, a dtype the release lacks, common_mps.py's expected failures, ...), a composite still
judged by its callees. `since`: the first covered release where the same question is answered native. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from opscan.errors import UsageError
from opscan.opkey import OpKey, macos_text
from opscan.verdict import Classification, Evidence, Verdict


@dataclass(frozen=True)
class Support:
    """One operator's answer for one release and macOS: its verdict, the evidence, since when it is native."""

    op: str  # PyTorch's spelling, aten::name.overload
    dtypes: tuple[str, ...]  # the input dtypes asked about; () for the dtype-free status
    release: str
    macos: str
    verdict: Verdict
    evidence: Evidence
    since: str | None  # the first covered release where the answer is native (None: none yet)
    kernel: str  # what serves it on MPS: mps, composite, python, cpu_fallback, none (as `opscan coverage`)
    remedy: str | None = None

    @property
    def native(self) -> bool:
        """Whether it runs natively on MPS (the verdict is `native`)."""
        return self.verdict == Verdict.NATIVE

    def to_dict(self) -> dict[str, Any]:
        """JSON form (op and overload as in the report)."""
        key = OpKey.parse(self.op)
        return {"op": key.op, "overload": key.overload, "dtypes": list(self.dtypes), "release": self.release,
                "macos": self.macos, "verdict": self.verdict.value, "evidence": self.evidence.to_dict(),
                "since": self.since, "kernel": self.kernel, "remedy": self.remedy}


def supports(op: Any, dtypes: Sequence[str] | str | None = None, *, release: str | None = None,
             macos: str | None = None) -> Support:
    """What `op` does on MPS in `release` (default: the installed torch, else the newest covered one) at `macos`
    (default: the release's minimum). `op`: "aten::take", "aten::add.Tensor", "take", or torch.ops.aten.take(.default).
    `dtypes`: the input dtypes ("float32" or ["float16", "int64"]); None for the dtype-free status."""
    from opscan.knowledge import installed_release, kb_releases, load_knowledge
    from opscan.predict.coverage import kernel_of

    key = op_key(op)
    wanted = dtype_names(dtypes)
    for name, value in (("release", release), ("macos", macos)):
        if value is not None and not isinstance(value, str):
            example = "'2.14.1'" if name == "release" else "'15.1'"
            raise UsageError(f"{name}={value!r:.80} is of type {type(value).__name__}, not text — pass it as a string "
                             f"(e.g. {name}={example})")
    kb = load_knowledge(release=release or installed_release() or kb_releases()[-1], macos=macos)
    _check_declared(key, kb)
    question = _question(key, wanted)
    found = question(kb)
    return Support(key.display, wanted, kb.release, macos_text(kb.macos), found.verdict, found.evidence,
                   _since(key, question, macos), kernel_of(key, kb), found.remedy)


# torch's dtype names, as opscan writes them (str(torch.float16) without "torch."); the aliases torch also accepts
DTYPE_NAMES = frozenset({
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
    "float32", "float64", "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4"})
DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "short": "int16", "int": "int32",
                 "long": "int64", "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32"}


def op_key(op: Any) -> OpKey:
    """The OpKey of an operator given by name or as a torch op (an OpOverloadPacket means its default);
    UsageError for anything else."""
    if not isinstance(op, str):
        text = str(op) if type(op).__name__ in ("OpOverload", "OpOverloadPacket") else None
        try:
            return OpKey.parse(text if text.count(".") == 2 else f"{text}.default")
        except (ValueError, AttributeError):
            raise UsageError(f"op={op!r:.80} is of type {type(op).__name__}, not an operator — pass its name "
                             "(aten::add.Tensor) or a torch op (torch.ops.aten.add.Tensor)") from None
    try:
        return OpKey.parse(op)
    except ValueError:
        raise UsageError(f"{op!r} is not an operator name — spell it aten::name or aten::name.overload "
                         "(e.g. aten::add.Tensor)") from None


def dtype_names(dtypes: Any) -> tuple[str, ...]:
    """The input dtypes asked about, as torch names: one name or torch.dtype, or a sequence of them; UsageError
    for anything else (an unknown or misspelt name, a number) — it would be answered as if it were a dtype."""
    if dtypes is None:
        return ()
    items = (dtypes,) if isinstance(dtypes, str) or type(dtypes).__name__ == "dtype" else dtypes
    try:
        items = tuple(items)
    except TypeError:
        raise UsageError(f"dtypes={dtypes!r:.80} is of type {type(dtypes).__name__} — pass a dtype name "
                         "('float32') or a list of them") from None
    return tuple(_dtype_name(item) for item in items)


def _dtype_name(item: Any) -> str:
    text = str(item).removeprefix("torch.") if type(item).__name__ == "dtype" else item
    if not isinstance(text, str):
        raise UsageError(f"dtype {item!r:.80} is of type {type(item).__name__}, not a dtype name — pass names such as "
                         "'float32' or torch dtypes")
    if text in DTYPE_NAMES:
        return text
    closest = _closest(text)
    hint = (f"torch calls it {DTYPE_ALIASES[text]}" if text in DTYPE_ALIASES else f"did you mean {closest}?"
            if closest else "torch's names are float32, float16, bfloat16, int64, ...")
    raise UsageError(f"{text!r:.80} is not a torch dtype — {hint}")


def _closest(text: str) -> str | None:
    import difflib

    found = difflib.get_close_matches(text, sorted(DTYPE_NAMES), n=1)
    return found[0] if found else None


def _check_declared(key: OpKey, kb) -> None:
    """UsageError for an aten name no covered release declares, with its overloads when only those exist."""
    from opscan.knowledge import kb_releases, load_knowledge

    if key.namespace != "aten" or kb.yaml.has(key) or key in kb.facts.outside_yaml:
        return
    newest = load_knowledge(release=kb_releases()[-1])
    if newest.yaml.has(key):
        return  # declared later: the answer for this release says so
    names = sorted(o.display for o in newest.yaml.overloads if o.name == key.name)
    hint = f"its overloads are {', '.join(names[:8])}" if names else "`opscan coverage --op NAME` lists them"
    raise UsageError(f"{key.display} is not an operator of torch {kb.release} or of any later covered release — "
                     f"{hint}")


def _question(key: OpKey, dtypes: tuple[str, ...]) -> Callable[[Any], Classification]:
    """The question asked of each release's knowledge base."""
    from opscan.predict.coverage import status_of
    from opscan.predict.rules import predict_op

    if not dtypes:
        return lambda kb: status_of(key, kb)

    def ask(kb) -> Classification:
        found = predict_op(key, dtypes, kb)
        if found.evidence.rule == "composite-no-callees":  # no step recorded its callees: judge the recorded ones
            return status_of(key, kb)
        return found
    return ask


def _since(key: OpKey, question: Callable[[Any], Classification], macos: str | None) -> str | None:
    from opscan.knowledge import load_knowledge
    from opscan.predict.history import release_groups

    for group in release_groups():
        kb = load_knowledge(release=group.first, macos=macos)
        declared = key.namespace != "aten" or kb.yaml.has(key) or key in kb.facts.outside_yaml
        if declared and question(kb).verdict == Verdict.NATIVE:  # as `opscan coverage` counts it
            return group.first
    return None
