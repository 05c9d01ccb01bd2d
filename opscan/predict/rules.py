"""Predict stage: the verdict for one (operator overload, input dtypes) on MPS, from the knowledge base.

Pure: no torch, no I/O; everything comes from an `opscan.knowledge.Knowledge`. `predict_op` tries the
rules below in order and the first that applies decides (dtype rules: dtype_rules.py). Each gives a stable rule id
(`Evidence.rule`), a sentence naming the release (`Evidence.text`), where the fact comes from
(`Evidence.source`), and a remedy for every verdict but `native`.

| # | rule id | verdict |
|---|---|---|
| 1 | `dtype-float64` | `unsupported_dtype`: a float64 or complex128 input |
| 1 | `dtype-release` | `unsupported_dtype`: a dtype the release lacks (bfloat16 before 2.3, ...; facts.yaml) |
| 1 | `dtype-complex` | `unsupported_dtype`: complex64/32 input, no SUPPORTED_COMPLEX_OPS OpInfo matches the op |
| 1 | `dtype-complex-no-list` | `unknown`: complex input, and the release has no common_mps.py |
| 2 | `always-cpu` | `cpu_fallback`: MPSFallback.mm sends it to the CPU whatever the variable says |
| 3 | `error-stub` | `error`: `_slow_conv2d_forward`'s MPS stub (mixed devices) |
| 4 | `shape-<id>` | `error`: a size rule of kernel_rules.yaml that `args_note` shows will fail (runtime_checks.py) |
| 4c | `kernel-<id>` | `error` / `unsupported_dtype`: an encoded kernel check that `args` fail (runtime_checks.py) |
| 4d | `kernel-fallback-<id>` | `cpu_fallback`: the op's MPS kernel runs the call on the CPU itself (below a macOS |
|   |   | version: nearest upsampling and nonzero in 2.0-2.4, nonzero in 2.5-2.8; kernel_rules.yaml `fallbacks`) |
| 4b | `dtype-xfail` / `macos-gate` | `unsupported_dtype` / `unknown`: common_mps.py expects the op's OpInfos to fail |
| 5 | `yaml-mps` / `yaml-mps-delegate` | `native`: an MPS kernel of its own / via its structured delegate |
| 5 | `mps-outside-yaml` | `native`: an MPS kernel registered by hand (2.0.0's bitwise ops; facts.yaml) |
| 6 | `python-registration` | `native`: implemented in Python for MPS in that release |
| 7 | `c10d-no-fallback` / `c10d-out-of-scope` | `error` (2.11+) / `unknown` |
| 7 | `amp-api` | `error` / `native`: torch.autocast("mps") (2.5+), torch.amp.GradScaler (2.3+) (amp.py) |
| 7 | `fft-half` | `error`: a torch.fft composite given float16/bfloat16 (CUDA only; amp.py) |
| 7 | `torchvision-mps` / `torchvision-mps-later` | `native` / `unsupported` (release before the kernel) |
| 7 | `torchvision-not-in-table` / `namespace-no-table` | `unknown`: no sourced table decides |
| 7 | `target-registration-mps` / `-composite` / `-no-mps` | `native` / `unknown` / `unsupported`: the target's own |
|   |   | torch.library op, by the dispatch keys its registration has kernels for (trace/registrations.py) |
| 8 | `composite-callees` / `composite-no-callees` | worst callee verdict / `unknown` |
| 8 | `composite-path` / `composite-no-native-path` | no traced callees: the path its arguments take / the least |
|   |  | severe of the paths' worst callees when every path has a non-native one (predict/composite.py) |
| 9 | `earlier-path` | the verdict of the op the release ran in its place (facts.yaml `earlier_paths`) |
| 9 | `not-in-yaml` | `unknown` |
| 10 | `no-mps-kernel` | `unsupported` |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opscan.predict.amp import amp_api, fft_half
from opscan.predict.dtype_rules import CHECK_ON_MAC, complex_support, expected_failure, float64, release_limit
from opscan.predict.dtype_rules import result as _result
from opscan.predict.composite import judge_call, judge_op
from opscan.predict.sparse import predict_sparse
from opscan.predict.runtime_checks import kernel_check, kernel_fallback, size_check, with_limits
from opscan.knowledge import Knowledge
from opscan.knowledge.facts import TorchvisionOp
from opscan.opkey import OpKey, Release
from opscan.verdict import Classification, Evidence, Verdict

TracedCallees = tuple[tuple[OpKey, tuple[str, ...]], ...]  # (op, its dtypes) per callee the trace saw

FALLBACK_REMEDY = (
    "set PYTORCH_ENABLE_MPS_FALLBACK=1 before importing torch (the op then runs on the CPU), or replace the op"
)
_FACTS = "mps_facts.md"


@dataclass(frozen=True)
class _Call:
    """The question one `predict_op` call asks."""

    op: OpKey
    dtypes: tuple[str, ...]
    kb: Knowledge
    callees: TracedCallees | None
    args_note: dict | None
    cpu_op: OpKey | None = None  # the op the CPU trace showed, when the MPS view runs another
    args: dict | None = None  # the call's arguments by name (predict/bind.py), for the conditions
    registration: object = None  # trace.registrations.Registration of a custom op the target registered itself

    @property
    def release(self) -> str:
        """The release predicted for."""
        return self.kb.release


def _always_cpu(c: _Call) -> Classification | None:
    """Rule 2: registered straight to the CPU fallback in MPSFallback.mm."""
    fact = c.kb.facts.always_cpu.get(c.op)
    if fact is None:
        return None
    text = (f"torch {c.release} registers {c.op} for MPS straight to the CPU fallback (MPSFallback.mm): "
            "it runs on the CPU even with PYTORCH_ENABLE_MPS_FALLBACK unset")
    later = c.kb.all_facts.always_cpu_until(c.op, c.release)
    remedy = f"replace the op or move the block to the CPU; {CHECK_ON_MAC}"
    if later:
        remedy = f"upgrade to torch {later} or later (it leaves the always-CPU list there), or replace the op"
    return _result(Verdict.CPU_FALLBACK, "always-cpu", text, fact.source, remedy)


def _listed(c: _Call, table, verdict: Verdict, rule: str, sentence: str, remedy: str | None = None):
    """A rule decided by the op being listed in one of the release's facts tables: `sentence` filled in with
    the release, the op and the fact's message; None when the op is not listed."""
    fact = table.get(c.op)
    if fact is None:
        return None
    text = sentence.format(release=c.release, op=c.op, message=fact.message)
    return _result(verdict, rule, text, fact.source, remedy)


def _error_stub(c: _Call) -> Classification | None:
    """Rule 3: an MPS registration that only raises (reached with mixed devices)."""
    return _listed(c, c.kb.facts.error_stubs, Verdict.ERROR, "error-stub",
                   "torch {release} registers {op} for MPS to an error stub, reached only when MPS and CPU tensors "
                   "are mixed: '{message}'", "keep the input and the weight on the same device (both on MPS)")


def _yaml_mps(c: _Call) -> Classification | None:
    """Rule 5: an MPS kernel in native_functions.yaml, own or inherited from a structured delegate."""
    kind = c.kb.yaml.mps_kernel(c.op) if c.op.namespace == "aten" else None
    if kind is None:
        return None
    if kind == "explicit":
        text = f"{c.kb.yaml_source} gives {c.op} an MPS kernel (predicted for torch {c.release})"
        return _result(Verdict.NATIVE, "yaml-mps", text, c.kb.yaml_source)
    delegate = c.kb.yaml.get(c.op).structured_delegate
    text = (f"{c.kb.yaml_source} makes {c.op} a structured op whose delegate {delegate} has an MPS "
            f"kernel (predicted for torch {c.release})")
    return _result(Verdict.NATIVE, "yaml-mps-delegate", text, c.kb.yaml_source)


def _outside_yaml(c: _Call) -> Classification | None:
    """Rule 5: an MPS kernel registered outside the yaml-generated code (facts.yaml)."""
    return _listed(c, c.kb.facts.outside_yaml, Verdict.NATIVE, "mps-outside-yaml",
                   "torch {release} registers an MPS kernel for {op} by hand, outside native_functions.yaml")


def _python_registration(c: _Call) -> Classification | None:
    """Rule 6: implemented in Python for MPS by torch.backends.mps._init()."""
    return _listed(c, c.kb.facts.python_registrations, Verdict.NATIVE, "python-registration",
                   "torch {release} implements {op} for MPS in Python (torch.backends.mps._init()): it runs as a "
                   "decomposition into MPS ops, not on the CPU")


def _distributed(c: _Call) -> Classification | None:
    """Rule 7 (c10d): distributed ops cannot fall back to the CPU from 2.11 on."""
    if c.op.namespace != "c10d":
        return None
    fact = c.kb.facts.distributed_error
    if fact is None:
        text = (f"{c.op} is a c10d (distributed) op: out of scope for v1, and torch {c.release} "
                "predates the 2.11 rule that c10d ops never fall back")
        return _result(Verdict.UNKNOWN, "c10d-out-of-scope", text, f"{_FACTS} §1.1", CHECK_ON_MAC)
    text = (f"torch {c.release} refuses c10d ops on MPS, with the fallback variable set or not: "
            f"'{fact.message}'")
    remedy = "train distributed on Linux GPUs; on the Mac, run a single process without c10d collectives"
    return _result(Verdict.ERROR, "c10d-no-fallback", text, fact.source, remedy)


def _other_namespace(c: _Call) -> Classification | None:
    """Rule 7: non-aten ops are known only through a sourced table (torchvision's), or — a custom op the target
    registered itself — through its own registrations."""
    if c.op.namespace == "aten":
        return None
    if c.registration is not None:
        return _target_registration(c, c.registration)
    entry = c.kb.torchvision.get(c.op)
    if entry is not None:
        return _torchvision(c, entry)
    rule = "torchvision-not-in-table" if c.op.namespace == "torchvision" else "namespace-no-table"
    text = (f"no sourced table lists {c.op} for namespace {c.op.namespace!r}, so MPS support in torch "
            f"{c.release} is not known (without an MPS kernel the boxed fallback takes it)")
    source = "opscan/knowledge/torchvision.yaml (the only non-aten table)"
    return _result(Verdict.UNKNOWN, rule, text, source, CHECK_ON_MAC)


def _target_registration(c: _Call, reg) -> Classification:
    """Rule 7: the target's own torch.library registration, as this process holds it (the same Python code
    registers the same kernels on the Mac, whatever the release)."""
    where = f"its registration (torch.library, {reg.at}) has kernels for {', '.join(reg.kernels)}"
    source = f"the dispatcher's registrations of {c.op} in this process (torch._C._dispatch_dump)"
    if reg.mps:
        return _result(Verdict.NATIVE, "target-registration-mps", f"{c.op}: {where}, MPS among them", source)
    if reg.composite:
        text = (f"{c.op}: {where}: no MPS kernel, but a {reg.composite} kernel that runs its Python body on MPS "
                "tensors, so the ops that body calls decide (they are not traced one by one)")
        return _result(Verdict.UNKNOWN, "target-registration-composite", text, source, CHECK_ON_MAC)
    text = (f"{c.op}: {where}: no MPS kernel and no composite one, so on MPS it raises NotImplementedError with "
            "PYTORCH_ENABLE_MPS_FALLBACK unset and runs on the CPU with it set")
    remedy = (f"register an MPS kernel for it (torch.library.register_kernel(\"{c.op}\", \"mps\", ...), or a "
              f"device-agnostic one), or {FALLBACK_REMEDY}")
    return _result(Verdict.UNSUPPORTED, "target-registration-no-mps", text, source, remedy)


def _torchvision(c: _Call, entry: TorchvisionOp) -> Classification:
    """A torchvision op of the table: native once its kernel shipped."""
    paired = f"torchvision {entry.since_torchvision} (paired with torch {entry.since_torch})"
    if Release.parse(c.release).series_key >= Release.parse(entry.since_torch).series_key:
        text = f"{c.op} has an MPS kernel since {paired}; predicted for torch {c.release}"
        return _result(Verdict.NATIVE, "torchvision-mps", text, entry.source)
    text = f"{c.op} has no MPS kernel before {paired}; torch {c.release} predates it"
    upgrade = f"upgrade to torch {entry.since_torch} with torchvision {entry.since_torchvision}"
    remedy = f"{upgrade}, or {FALLBACK_REMEDY}"
    return _result(Verdict.UNSUPPORTED, "torchvision-mps-later", text, entry.source, remedy)


def _composite(c: _Call) -> Classification | None:
    """Rule 8: a composite runs its callees on MPS; the worst callee decides (predict/composite.py)."""
    return judge_call(c, _judge(c.kb), lambda op, layouts: predict_sparse(op, layouts, c.kb))


def _judge(kb: Knowledge):
    """predict_op bound to `kb`: how predict/composite.py judges a composite's callees."""
    return lambda op, dtypes, callees=None: predict_op(op, dtypes, kb, callees=callees)


def judge_composite(op: OpKey, dtypes: tuple[str, ...], kb: Knowledge) -> Classification:
    """A composite by what the knowledge base knows it calls, after the dtype layer (predict/composite.py
    judge_op): `opscan coverage`'s dtype-free rows and the ops `release-callees` adds."""
    return judge_op(op, dtypes, kb, _judge(kb))


def _earlier_path(c: _Call) -> Classification | None:
    """Rule 9: an aten op the yaml does not declare, where facts.yaml knows what the release ran in its place
    (the installed torch's decomposition calls a newer op): that op's verdict, with the same inputs."""
    path = c.kb.facts.earlier_paths.get(c.op)
    if path is None or c.kb.yaml.get(c.op) is not None:
        return None
    ran = path.ran[0]
    found = predict_op(ran, c.dtypes, c.kb)
    text = (f"{c.op} is not in {c.kb.yaml_source}: the installed torch's decomposition dispatched it, and torch "
            f"{c.release} ran {ran} in its place ({path.message}); {ran}: {found.evidence.text}")
    source = " + ".join(dict.fromkeys((path.source, found.evidence.source)))
    return Classification(found.verdict, Evidence("earlier-path", text, source), found.remedy, found.since)


def _not_in_yaml(c: _Call) -> Classification | None:
    """Rule 9: an aten op the yaml does not declare."""
    if c.kb.yaml.get(c.op) is not None:
        return None
    text = f"{c.op} is not in {c.kb.yaml_source} (predicted for torch {c.release})"
    if c.kb.installed_release and c.kb.installed_release != c.release:
        text += (f"; the step was traced with torch {c.kb.installed_release}, whose decomposition dispatched it: "
                 f"what torch {c.release} runs in its place is not known, and it does not decide the upgrade advice")
    return _result(Verdict.UNKNOWN, "not-in-yaml", text, c.kb.yaml_source, CHECK_ON_MAC)


def _no_kernel(c: _Call) -> Classification:
    """Rule 10: declared, not composite, no MPS kernel."""
    text = (f"{c.kb.yaml_source} has no MPS kernel for {c.op} and it is not composite: in torch "
            f"{c.release} it raises NotImplementedError with PYTORCH_ENABLE_MPS_FALLBACK unset and "
            "runs on the CPU with it set")
    return _result(Verdict.UNSUPPORTED, "no-mps-kernel", text, c.kb.yaml_source, FALLBACK_REMEDY)


_RULES: tuple[Callable[[_Call], Classification | None], ...] = (
    float64, release_limit, complex_support, _always_cpu, _error_stub, size_check, kernel_check, kernel_fallback,
    expected_failure,
    _yaml_mps, _outside_yaml, _python_registration, _distributed, amp_api, fft_half, _other_namespace, _composite,
    _earlier_path, _not_in_yaml,
)


def predict_op(
    op: OpKey,
    dtypes: tuple[str, ...],
    kb: Knowledge,
    *,
    callees: TracedCallees | None = None,
    args_note: dict | None = None,
    cpu_op: OpKey | None = None,
    args: dict | None = None,
    registration=None,
) -> Classification:
    """Predict what `op` does on MPS for inputs of `dtypes` ("float32", ...) in `kb.release`.

    `callees`: for a composite op, the (OpKey, dtypes) of the ops it calls on MPS; None or () when
    not known (a composite then gets `unknown`, never `native`). `args_note`: sizes some kernel
    checks need, keys documented in predict.runtime_checks (build it with `note_from_shapes`).
    `cpu_op`: the op the CPU trace showed where the MPS view runs another (its OpInfo expectations count).
    `args`: the call's arguments by name (predict/bind.py), read by the kernels' runtime checks; a
    row native from the yaml names the checks of its kernel that the prediction does not decide.
    `registration`: a custom op the target registered itself (trace/registrations.py): its dispatch keys decide.
    """
    call = _Call(op, tuple(dtypes), kb, tuple(callees) if callees else None, args_note, cpu_op, args, registration)
    for rule in _RULES:
        result = rule(call)
        if result is not None:
            return with_limits(call, result) if result.evidence.rule in _YAML_KERNEL_RULES else result
    return _no_kernel(call)


# native from native_functions.yaml: such a row also names its kernel's runtime checks the prediction leaves open
_YAML_KERNEL_RULES = frozenset({"yaml-mps", "yaml-mps-delegate"})
