"""Predict stage: the dtype rules of `predict.rules.predict_op` (rule 1 and rule 4b of its table).

Pure: no torch, no I/O. Each rule takes classify's call record (`op`, `dtypes`, `kb`, `cpu_op`,
`release`) and returns a Classification or None:

* `dtype-float64`: float64 / complex128 never exist on MPS;
* `dtype-release`: a dtype the release lacks entirely or below a macOS (facts.yaml `dtype_limits`);
* `dtype-complex`: complex64 only for ops PyTorch's tests expect to work in complex (the release's
  SUPPORTED_COMPLEX_OPS, matched by name or through opinfo_map.txt: an OpInfo mapped to the op, or
  one whose complex64 samples dispatched it with a complex tensor, its `dispatch` line: `fft.irfft2`
  runs `_fft_c2r`); `dtype-complex-no-list` when the release has no common_mps.py;
* `dtype-xfail` / `macos-gate`: the release's UNIMPLEMENTED_XFAILLIST (and its macOS-gated entries,
  and the MACOS_BEFORE_14_4 / 15_0 lists) expect the OpInfos carried by this op to fail for the
  call's first input dtype; an entry whose comment states a condition (expectation_conditions.yaml:
  bincount's float64 output is its weighted form's) only for calls that meet it. An OpInfo's
  expectation reaches an aten op only through
  opinfo_map.txt, and only when *every* OpInfo mapped to the op (or to its structured family) that
  PyTorch tests in that dtype on MPS expects it to fail: one failing OpInfo never condemns every op
  it touches. Entries for every dtype (`None`) are not dtype facts (the yaml or a shape rule
  decides), unless a macOS condition gates them.
"""

from __future__ import annotations

import functools

from opscan.knowledge import Knowledge
from opscan.knowledge.conditions import TensorArg
from opscan.knowledge.expectations import Condition, conditions_for, holds
from opscan.opkey import parse_macos
from opscan.verdict import Classification, Evidence, Verdict

CHECK_ON_MAC = "check on a Mac with PYTORCH_MPS_LOG_PROFILE_INFO=68"
NO_MPS_DTYPES = frozenset({"float64", "complex128"})
COMPLEX = frozenset({"complex64", "complex32"})
COMPLEX64 = "complex64"  # the dtype of opinfo_map.txt's `dispatch` lines
UNIMPLEMENTED = "UNIMPLEMENTED_XFAILLIST"
# macOS-gated lists that describe missing support; 2.8's MACOS_BEFORE_13_3_XFAILLIST is commented
# "Failures due to precision issues (due to fast-math)", so it is not one of them.
GATE_LISTS = ("MACOS_BEFORE_14_4_XFAILLIST", "MACOS_BEFORE_15_0_XFAILLIST")
_FACTS = "mps_facts.md"


def lacks_dtype(dtypes, kb) -> bool:
    """A dtype MPS lacks for a call: float64/complex128 always, or one the release lacks (at the assumed macOS,
    facts.yaml dtype_limits), so no view or copy of it exists either: predict_op's dtype rules decide."""
    lacking = {limit.dtype for limit in kb.facts.dtype_limits
               if limit.min_macos is None or kb.macos < parse_macos(limit.min_macos)}
    return any(d in NO_MPS_DTYPES or d in lacking for d in dtypes)


def result(verdict: Verdict, rule: str, text: str, source: str, remedy: str | None = None) -> Classification:
    """A Classification with its evidence."""
    return Classification(verdict, Evidence(rule, text, source), remedy)


def float64(c) -> Classification | None:
    """MPS has no float64 or complex128 at all."""
    wide = sorted(NO_MPS_DTYPES.intersection(c.dtypes))
    if not wide:
        return None
    text = (f"{c.op} gets {', '.join(wide)} input; MPS in torch {c.release} supports neither "
            "('Cannot convert a MPS Tensor to float64 dtype ...')")
    remedy = "cast to float32 (complex128 to complex64) before moving the tensors to MPS"
    return result(Verdict.UNSUPPORTED_DTYPE, "dtype-float64", text, f"{_FACTS} §4.2 [bin]", remedy)


def release_limit(c) -> Classification | None:
    """A dtype the release (or the assumed macOS) lacks, whatever the op."""
    for limit in c.kb.facts.dtype_limits:
        if limit.dtype in c.dtypes and (limit.min_macos is None or c.kb.macos < parse_macos(limit.min_macos)):
            where = f" below macOS {limit.min_macos}" if limit.min_macos else ""
            text = (f"{c.op} gets {limit.dtype} input; MPS in torch {c.release} lacks {limit.dtype}{where}: "
                    f"'{limit.message}'")
            fix = f"run macOS {limit.min_macos} or newer, or " if limit.min_macos else ""
            remedy = f"{fix}upgrade torch, or cast to float32 before moving the tensors to MPS"
            return result(Verdict.UNSUPPORTED_DTYPE, "dtype-release", text, limit.source, remedy)
    return None


def complex_support(c) -> Classification | None:
    """complex64/complex32 only for ops PyTorch's MPS tests run in complex."""
    if c.op.namespace != "aten" or not COMPLEX.intersection(c.dtypes):
        return None
    lists = c.kb.common_mps
    if lists is None:
        text = (f"torch {c.release}'s wheel has no common_mps.py (it ships from 2.8.0), so complex support "
                f"of {c.op} is not known")
        return result(Verdict.UNKNOWN, "dtype-complex-no-list", text, f"{_FACTS} §3", CHECK_ON_MAC)
    supported = lists.supported_complex(c.kb.macos)
    carried = opinfos_for(c) + opinfos_for(c, COMPLEX64)
    if lists.complex_match(c.op.name, c.kb.macos) or supported.intersection(carried):
        return None
    text = (f"{c.op} has complex input and no OpInfo in SUPPORTED_COMPLEX_OPS of common_mps.py (torch "
            f"{c.release} wheel) matches it by name or dispatches it, so PyTorch expects complex64 to fail on MPS")
    remedy = f"move the complex math to the CPU or rewrite it with real tensors; {CHECK_ON_MAC}"
    source = f"common_mps.py SUPPORTED_COMPLEX_OPS (torch {c.release} wheel); {_FACTS} §3"
    return result(Verdict.UNSUPPORTED_DTYPE, "dtype-complex", text, source, remedy)


def expected_failure(c) -> Classification | None:
    """The OpInfos this op carries are all expected to fail in its first input dtype."""
    kb: Knowledge = c.kb
    if kb.common_mps is None or kb.opinfo is None or c.op.namespace != "aten":
        return None
    entry = kb.yaml.get(c.op)
    runs = entry is not None and (kb.yaml.mps_kernel(c.op) or entry.composite or c.op in kb.facts.python_registrations)
    dtype = c.dtypes[0] if c.dtypes else None  # no dtypes (coverage): only expectations for every dtype
    mapped = opinfos_for(c) + (opinfos_for(c, dtype) if dtype == COMPLEX64 else ())
    tested = [o for o in dict.fromkeys(mapped) if dtype is None or dtype in kb.opinfo.rows[o].mps_dtypes]
    failing = {o: why for o in tested if (why := _fails(kb, o, dtype, c.dtypes or None)) is not None}
    if not runs or not failing or len(failing) != len(tested):
        return None
    return _expected(c, dtype, failing)


def _expected(c, dtype: str | None, failing: dict[str, tuple]) -> Classification:
    """The Classification of an expected failure; `failing`: OpInfo -> (list, dtypes, gate, condition)."""
    gates = sorted({gate for _, _, gate, _ in failing.values() if gate}, key=parse_macos)
    dtype_specific = any(dtypes is not None for _, dtypes, _, _ in failing.values())
    named = ", ".join(f"'{o}' ({lst}{f', below macOS {g}' if g else ''}{_stated(cond)})"
                      for o, (lst, _, g, cond) in failing.items())
    via = f"opinfo_map.txt maps them to {c.op}" + (f" (the CPU trace's {c.cpu_op})" if c.cpu_op else "")
    source = f"common_mps.py (torch {c.release} wheel) + {c.kb.opinfo.source}; {_FACTS} §3"
    conditions = [cond.source for _, _, _, cond in failing.values() if cond is not None]
    if conditions:
        source = " + ".join([source, "expectation_conditions.yaml", *conditions])
    if dtype_specific:
        text = (f"PyTorch's own MPS tests expect {named} to fail for {dtype} in torch {c.release}; {via}, and "
                f"every OpInfo mapped there that is tested in {dtype} expects the failure")
        gate = f"run macOS {gates[-1]} or newer, or " if gates else ""
        cast = "cast to a dtype the list does not name (e.g. float32) or move the op to the CPU"
        remedy = f"{gate}{cast}; {CHECK_ON_MAC}"
        return result(Verdict.UNSUPPORTED_DTYPE, "dtype-xfail", text, source, remedy)
    text = (f"PyTorch's own MPS tests expect {named} to fail in torch {c.release} for every dtype below macOS "
            f"{gates[-1]} (assumed macOS {'.'.join(map(str, c.kb.macos))}); {via}; how it fails is not recorded")
    remedy = f"run macOS {gates[-1]} or newer (predict for it with --macos {gates[-1]}); {CHECK_ON_MAC}"
    return result(Verdict.UNKNOWN, "macos-gate", text, source, remedy)


def _fails(kb: Knowledge, opinfo: str, dtype: str | None, dtypes: tuple[str, ...] | None = None) -> tuple | None:
    """(list, dtypes, gate, condition) when `opinfo` is expected to fail in `dtype` at kb.macos for a call with
    input `dtypes`, else None. An entry whose comment states a condition (expectation_conditions.yaml) holds
    only for calls that meet it."""
    for name in (UNIMPLEMENTED, *GATE_LISTS):
        listed = kb.common_mps.xfail(name, kb.macos).get(opinfo, "absent")
        gate = _gate(kb, name, opinfo)
        if listed == "absent" or (listed is None and gate is None):
            continue
        if listed is None or (dtype is not None and dtype in listed):
            condition = _condition(kb, name, opinfo)
            if condition is not None and holds(condition, dtypes, kb.macos) is not True:
                continue
            return name, listed, gate, condition
    return None


def _condition(kb: Knowledge, name: str, opinfo: str) -> Condition | None:
    """The condition of an entry in this release, when its comment still says what the condition quotes."""
    note = kb.common_mps.note(name, opinfo)
    return next((c for c in conditions_for(name, opinfo, kb.release) if c.comment == note), None)


def _stated(condition: Condition | None) -> str:
    """", its comment '...' limits it to ...: this call meets it" for an entry with a condition, else ""."""
    if condition is None:
        return ""
    return f", whose comment '{condition.comment}' limits it to calls where {condition.when}: {condition.means}"


def _gate(kb: Knowledge, name: str, opinfo: str) -> str | None:
    """The macOS below which an expectation applies, when a condition or the list name gates it."""
    if name in GATE_LISTS:
        return name.split("_")[2] + "." + name.split("_")[3]
    plain = kb.common_mps.xfail(name, None).get(opinfo, "absent")
    now = kb.common_mps.xfail(name, kb.macos).get(opinfo, "absent")
    if plain == now:
        return None
    return kb.common_mps.gate_of(name, opinfo, kb.macos)


def opinfos_for(c, dtype: str | None = None) -> tuple[str, ...]:
    """OpInfo names opinfo_map.txt maps to this op, its CPU-side op, or their structured families; with
    `dtype`, those whose samples in that dtype dispatched it (the map's `dispatch` lines) instead."""
    if c.kb.opinfo is None:
        return ()
    names = [c.op] + ([c.cpu_op] if c.cpu_op is not None else [])
    families = _families(c.kb, dtype)
    found = [o for op in names if op.namespace == "aten" for o in families.get(_family(c.kb, op.yaml_name), ())]
    rank = _rank(c)
    if rank is not None:  # a device-branch op of the MPS view, mapped per input rank (`OP@RANK`)
        found += families.get(f"{c.op.yaml_name}@{rank}", ())
    return tuple(dict.fromkeys(found))


def _rank(c) -> int | None:
    """The rank of the call's first argument, when its arguments were recorded (predict/bind.py)."""
    first = next(iter((getattr(c, "args", None) or {}).values()), None)
    return first.dim if isinstance(first, TensorArg) else None


def ranked(kb: Knowledge, op) -> bool:
    """Whether opinfo_map.txt maps OpInfos to `op` per input rank (then its calls need their arguments)."""
    return kb.opinfo is not None and op.namespace == "aten" and op.yaml_name in _ranked_names(kb)


@functools.lru_cache(maxsize=64)
def _ranked_names(kb: Knowledge) -> frozenset[str]:
    """The ops opinfo_map.txt maps per rank (cached per knowledge base)."""
    return frozenset(k.split("@", 1)[0] for k in (*_families(kb), *_families(kb, COMPLEX64)) if "@" in k)


def _family(kb: Knowledge, name: str) -> str:
    """An overload's structured delegate (the kernel it shares), else itself."""
    flags_ref = kb.yaml.raw.get(name)
    ref = flags_ref[1] if flags_ref else None
    return ref[1:] if ref and ref[0] == "<" else name


@functools.lru_cache(maxsize=64)
def _families(kb: Knowledge, dtype: str | None = None) -> dict[str, tuple[str, ...]]:
    """Family -> OpInfo names mapped to any of its overloads (with `dtype`: dispatched in it; cached)."""
    out: dict[str, list[str]] = {}
    index = kb.opinfo.by_overload if dtype is None else kb.opinfo.by_dispatch.get(dtype, {})
    for overload, opinfos in index.items():
        out.setdefault(_family(kb, overload), []).extend(opinfos)
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}
