"""Predict stage: verdicts for the MPS view's calls, from the knowledge base.

Wraps `predict.rules.predict_op` with what the view knows and the classifier doesn't: a composite's
recorded callees, metadata-only views, the shapes the kernel checks need, sparse layouts (judged by
predict/sparse.py from the release's SparseMPS registrations, never by the dense kernel) and the known
silent-correctness bugs a call's arguments meet (predict/silent.py: a predicted `mismatch`), and the placement model
(predict/placement.py: a host tensor an MPS kernel refuses is an `error` of the user's code). One verdict per call;
a report row takes the worst of its calls.
"""

from __future__ import annotations

from opscan.predict import placement, release_paths, silent
from opscan.predict.bind import arguments, recording
from opscan.predict.runtime_checks import needs_args, note_from_shapes
from opscan.predict.dtype_rules import lacks_dtype
from opscan.predict.rules import predict_op
from opscan.predict.sparse import predict_sparse, sparse_layouts
from opscan.knowledge import Knowledge
from opscan.mps_view import BRANCHED_COMPOSITES, COPY, SRC_COPY, MpsCall
from opscan.opkey import OpKey
from opscan.verdict import Classification, Evidence, Verdict

# rules whose native verdict is a kernel of the op's own (decided_by "kernel"), not inferred by a rule
DIRECT_KERNEL_RULES = frozenset({"yaml-mps", "yaml-mps-delegate", "torchvision-mps"})


def has_mps_kernel(kb: Knowledge):
    """Predicate for the lens: does the release's yaml give `op` an MPS kernel?"""
    return lambda op: kb.yaml.mps_kernel(op) is not None


class AmpAnswers:
    """A release's answers to the trace's mixed-precision questions (opscan/trace/questions.py), from its row of
    knowledge/autocast_mps.txt under the assumed macOS: `amp` of the trace's Questions. `ops`: every op some
    release's policy lists (the trace registers its kernels for these)."""

    def __init__(self, policy, macos: tuple[int, int]):
        from opscan.knowledge.autocast import all_ops

        self.policy, self.macos = policy, tuple(macos)
        self.ops = all_ops()

    def __call__(self, question: tuple[str, object]):
        from opscan.trace.questions import AUTOCAST, AUTOCAST_OP, GRADSCALER

        kind, subject = question
        if kind == AUTOCAST:
            return self.policy.gate(subject, self.macos)
        if kind == AUTOCAST_OP:
            return self.policy.cast(subject)
        if kind == GRADSCALER:
            return self.policy.gradscaler
        raise ValueError(f"not a mixed-precision question: {question!r}")


def amp_of(kb: Knowledge) -> AmpAnswers | None:
    """The release's answers to the trace's mixed-precision questions, None when the table lacks the release."""
    from opscan.knowledge.autocast import policy_of

    policy = policy_of(kb.release)
    return None if policy is None else AmpAnswers(policy, kb.macos)


def should_expand(kb: Knowledge):
    """Predicate for the recorder: composites without an MPS kernel whose callees we must see."""
    def expand(op: OpKey) -> bool:
        if op.namespace != "aten" or op in BRANCHED_COMPOSITES or op == COPY or kb.yaml.mps_kernel(op) is not None:
            return False
        if op in kb.facts.always_cpu or op in kb.facts.python_registrations:
            return False
        entry = kb.yaml.get(op)
        return entry is not None and entry.cea
    return expand


def predict_call(call: MpsCall, kb: Knowledge, cache: dict) -> Classification:
    """The predicted verdict of one MPS-view call."""
    note = note_from_shapes(call.op, [t.shape for t in call.inputs], [t.shape for t in call.outputs])
    if note and any(d < 0 for dims in note.values() for d in dims):
        note = None  # a size that depends on values (-1 under fake tensors): no shape rule can judge it
    args = arguments(call, recording(kb)) if needs_args(call.op, kb) else None
    key = (call.op, call.dtypes, call.callees, repr(note), call.cpu_op, call.rule, repr(args), call.registration)
    if key not in cache:
        cache[key] = _classify(call, kb, note, args)
    found = cache[key]
    layout = silent.key(call)  # what a silent-bug condition reads: judged apart, so that the classification
    if layout is not None:  # above stays shared by every call of the op whatever its strides and offsets
        if (key, layout) not in cache:
            cache[(key, layout)] = silent.silent_verdict(call, kb, found)
        found = cache[(key, layout)]
    placed = placement.placement_key(call)  # where the user's code puts the call's tensors: judged last (a host
    if placed is None:  # tensor a kernel refuses is the user's bug: predict/placement.py)
        return found
    if (key, layout, placed) not in cache:
        cache[(key, layout, placed)] = placement.placed(call, kb, found)
    return cache[(key, layout, placed)]


def _classify(call: MpsCall, kb: Knowledge, note, args=None) -> Classification:
    layouts = sparse_layouts(call)
    if layouts:  # never a dense verdict for a sparse tensor (predict/sparse.py)
        return predict_sparse(call.op, layouts, kb)
    if call.callees == () and not lacks_dtype(call.dtypes, kb):
        return Classification(Verdict.NATIVE, Evidence(
            "composite-metadata",
            f"{call.op} is composite and dispatches no other op (a view, or checked on CPU and meta "
            f"tensors): it only builds tensor metadata, no kernel runs (torch {kb.release})",
            kb.yaml_source,
        ))
    if call.rule == release_paths.RULE:
        return release_paths.judge_added(call, kb)
    # copy_ is MPS's own copy whichever composite issued it, also one whose path in the release is not known
    # (release_paths marks that call UNKNOWN_RULE over its mps-copy rule)
    if (call.rule == "mps-copy" or call.op == COPY) and not lacks_dtype(call.dtypes, kb):
        return Classification(Verdict.NATIVE, Evidence(
            "mps-copy", f"copy_ into or out of an MPS tensor runs MPS's own copy (torch {kb.release})", SRC_COPY))
    found = predict_op(call.op, call.dtypes, kb, callees=call.callees or None, args_note=note, cpu_op=call.cpu_op,
                       args=args, registration=call.registration)
    if call.rule == release_paths.UNKNOWN_RULE:
        return release_paths.judge_unknown(found, call, kb)
    if call.rule and found.verdict == Verdict.NATIVE:
        text = f"{found.evidence.text}; MPS dispatches it where the CPU trace shows {call.cpu_op} (rule {call.rule})"
        return Classification(found.verdict, Evidence(found.evidence.rule, text, found.evidence.source),
                              found.remedy, found.since)
    return found


def decided_by(classification: Classification) -> str:
    """"kernel" (a direct MPS entry), "unknown", or "rule" (everything else)."""
    if classification.verdict == Verdict.UNKNOWN:
        return "unknown"
    return "kernel" if classification.evidence.rule in DIRECT_KERNEL_RULES else "rule"
