"""Predict stage: the runtime checks inside MPS kernels (rules 4 and 4c of `predict.rules.predict_op`).

A release's MPS kernels refuse some inputs with their own checks (kernel_checks.txt, read from each
release's binary). The encoded ones (kernel_rules.yaml) are evaluated on the call's arguments: a check
that fails makes the call `error` or `unsupported_dtype` (rule `kernel-<id>`), with the kernel's own message
and file:line. A call predicted `native` from the yaml whose kernel has checks the prediction cannot decide
says so in its evidence ("the MPS kernel of X has N runtime checks the prediction does not model: …").

Some kernels run the work on the CPU themselves below a macOS version (kernel_rules.yaml `fallbacks`, rule
`kernel-fallback-<id>`, rule 4d): a call whose release's binary has the fallback and that meets its condition is
`cpu_fallback`, whatever PYTORCH_ENABLE_MPS_FALLBACK says.

The size rules (kernel_rules.yaml `size_rules`, rule `shape-<id>`) are decided first, from the call's pooled
sizes (`args_note`: {"input_spatial": [H, W], "output_size": [oH, oW]}, built by `note_from_shapes` from the
traced shapes, so callers need not know each op's argument order).

A rule's condition reads the call's arguments by their schema names (predict/bind.py). Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from opscan.knowledge.conditions import evaluate_when
from opscan.knowledge.callees import PATHS, callees
from opscan.knowledge.kernel_rules import SizeRule, load_kernel_rules
from opscan.opkey import OpKey, macos_text
from opscan.predict.bind import first_tensor
from opscan.predict.dtype_rules import result
from opscan.verdict import Classification, Evidence, Verdict

SHOWN = 4  # unmodelled checks named in a row's evidence (the rest are counted)


def bound_for(rule, args: dict) -> dict:
    """The names a rule's condition reads: the call's arguments (predict/bind.py), or for a message pattern's rule
    its first tensor argument as `self`."""
    return {"self": first_tensor(args)} if rule.first_tensor else args


def needs_args(op, kb) -> bool:
    """Whether predicting `op` reads its call's arguments: an encoded check of its kernel, dtype
    expectations mapped per input rank (predict.dtype_rules.ranked), or a composite whose path depends on them
    (knowledge/composite_paths.yaml)."""
    from opscan.predict.dtype_rules import ranked

    has_rules = kb.limits is not None and op.namespace == "aten" and bool(kb.limits.rules_for(op.yaml_name))
    has_rules = has_rules or (op.namespace == "aten" and op.yaml_name in _fallback_ops())
    return has_rules or ranked(kb, op) or callees(op, kb, PATHS) is not None


# Which recorded tensor carries the pooled input and which the pooled output:
# ("in", i) = the i-th tensor input, ("out", i) = the i-th tensor output.
_POOL_TENSORS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "_adaptive_avg_pool2d": (("in", 0), ("out", 0)),
    "adaptive_avg_pool2d": (("in", 0), ("out", 0)),
    "adaptive_max_pool2d": (("in", 0), ("out", 0)),
    "_adaptive_avg_pool2d_backward": (("in", 1), ("in", 0)),  # (grad_output, self)
    "adaptive_max_pool2d_backward": (("in", 1), ("in", 0)),  # (grad_output, self, indices)
}


def note_from_shapes(op: OpKey, inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> dict | None:
    """The args_note of one call from its tensor input and output shapes, or None if no size rule concerns
    `op` (or the shapes are too short)."""
    where = _POOL_TENSORS.get(op.name) if op.namespace == "aten" else None
    if where is None:
        return None
    shapes = {"in": inputs, "out": outputs}
    try:
        src, dst = (shapes[kind][i] for kind, i in where)
    except IndexError:
        return None
    if len(src) < 2 or len(dst) < 2:
        return None
    return {"input_spatial": list(src[-2:]), "output_size": list(dst[-2:])}


def size_rule_fires(rule: SizeRule, note: dict | None) -> bool | None:
    """Whether the kernel raises for these sizes; None when the note lacks two positive sizes of each."""
    pairs = {k: (note or {}).get(k) for k in ("input_spatial", "output_size")}
    if not all(isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(d, int) and d > 0 for d in v)
               for v in pairs.values()):
        return None
    return evaluate_when(rule, pairs, (0, 0))  # size rules read no macOS version


def size_check(c) -> Classification | None:
    """Rule 4: a size rule of the release's series that the call's sizes (args_note) fail."""
    for rule in load_kernel_rules().size_rules:
        if c.op in rule.ops and rule.releases.covers(c.release) and size_rule_fires(rule, c.args_note):
            text = (f"the MPS kernel of {c.op} in torch {c.release} raises for these sizes "
                    f"{c.args_note}: '{rule.message}'")
            return result(Verdict.ERROR, f"shape-{rule.id}", text, rule.source, rule.remedy)
    return None


def kernel_check(c) -> Classification | None:
    """Rule 4c: an encoded check of the op's MPS kernel that the call's arguments fail."""
    limits = c.kb.limits
    if limits is None or c.op.namespace != "aten" or c.args is None:
        return None
    for rule, check in limits.rules_for(c.op.yaml_name):
        if evaluate_when(rule, bound_for(rule, c.args), c.kb.macos):
            text = (f"the MPS kernel of {c.op} in torch {c.release} raises for this call: '{check.message.strip()}' "
                    f"({rule.kind} check {rule.condition}; {check.macro} in {check.function})")
            source = f"{check.where} [bin]; condition: {rule.source}"
            verdict = Verdict(rule.verdict)
            return result(verdict, f"kernel-{rule.id}", text, source, rule.remedy)
    return None


@functools.lru_cache(maxsize=1)
def _fallback_ops() -> frozenset[str]:
    return frozenset(op for rule in load_kernel_rules().fallbacks for op in rule.ops)


def kernel_fallback(c) -> Classification | None:
    """Rule 4d: a CPU fallback inside the op's MPS kernel (kernel_rules.yaml `fallbacks`) that this call meets."""
    if c.op.namespace != "aten" or c.args is None or c.kb.yaml.mps_kernel(c.op) is None:
        return None
    for rule in load_kernel_rules().fallbacks:
        if c.op.yaml_name in rule.ops and rule.releases.covers(c.release) and evaluate_when(
                rule, bound_for(rule, c.args), c.kb.macos):
            macos = macos_text(c.kb.macos)
            text = (f"the MPS kernel of {c.op} in torch {c.release} runs this call on the CPU itself on macOS {macos} "
                    f"(a CPU copy of its inputs, the CPU op, the result copied back), whatever "
                    f"PYTORCH_ENABLE_MPS_FALLBACK says: '{rule.message}' ({rule.condition})")
            return result(Verdict.CPU_FALLBACK, f"kernel-fallback-{rule.id}", text, rule.source, rule.remedy)
    return None


def with_limits(c, found: Classification) -> Classification:
    """A native yaml verdict, with the checks of its kernel that the prediction does not decide named."""
    limits = c.kb.limits
    if limits is None or c.op.namespace != "aten":
        return found
    name = c.op.yaml_name
    undecided = [check for rule, check in limits.rules_for(name)
                 if c.args is None or evaluate_when(rule, bound_for(rule, c.args), c.kb.macos) is None]
    open_checks = list(dict.fromkeys([*limits.unmodelled(name), *undecided]))
    if not open_checks:
        return found
    named = "; ".join(f"'{k.message.strip()}' ({k.file.rsplit('/', 1)[-1]}:{k.line or '?'})"
                      for k in open_checks[:SHOWN])
    more = f"; and {len(open_checks) - SHOWN} more" if len(open_checks) > SHOWN else ""
    text = (f"{found.evidence.text}; the MPS kernel of {c.op} has {len(open_checks)} runtime "
            f"check{'s' if len(open_checks) != 1 else ''} the prediction does not model: {named}{more}")
    source = f"{found.evidence.source} + kernel_checks.txt (torch {limits.release} wheel) [bin]"
    return Classification(found.verdict, Evidence(found.evidence.rule, text, source), found.remedy, found.since)
