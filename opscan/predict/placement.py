"""Predict stage: a call as the user's own code places its tensors on a Mac (the placement model, trace/tensors.py).

A call whose tensors all stay on the CPU (a host tensor made from host tensors, a factory without `device=`) runs
on the CPU's kernel: `native` (rule `placement-host`), whatever MPS would say of it. A call dispatched to MPS (some
tensor on the device) with a host tensor among its arguments runs the op's MPS kernel, which takes that CPU tensor
or refuses it as knowledge/placement.yaml says for the release (`placement_rule`): refused, the call is `error` (rule
`placement-<id>`: the step as written raises on a Mac, a bug of the user's code, not a limit of MPS); taken, the
call keeps its verdict; no rule, or a case the rule leaves open, `unknown` with the reason (`placement-unknown`).
A call whose op has no MPS kernel keeps its verdict: the fallback (with PYTORCH_ENABLE_MPS_FALLBACK set) copies
every tensor to the CPU, and without it the call raises anyway. Pure: no torch.
"""

from __future__ import annotations

import functools

from opscan.knowledge.placement import placement_rule
from opscan.predict.dtype_rules import lacks_dtype
from opscan.opkey import OpKey
from opscan.verdict import Classification, Evidence, Verdict

PLACEMENT_PREFIX = "placement-"
HOST_RULE = "placement-host"
UNKNOWN_RULE = "placement-unknown"
_SOURCE = "opscan/knowledge/placement.yaml (the MPS kernels' paths, per release) and the trace's placement model"
REMEDY = ("put the tensor on the step's device where it is made — `device=x.device` in a factory, "
          "`self.register_buffer(...)` for a module's tensor, `.to(out.device)` for a tensor made before the step; "
          "the placement finding names its line (or tell opscan your code moves it: device_tensors() in the target)")
_JUDGED = frozenset({Verdict.NATIVE, Verdict.UNKNOWN, Verdict.MISMATCH})  # verdicts whose call runs an MPS kernel
CAST_RULE = "placement-cast-on-host"
_COPIES = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize"})
_SRC_CAST = ("aten/src/ATen/native/mps/operations/Copy.mm copy_to_mps_: a CPU source of another dtype is converted on "
             "the CPU before the copy — the oldest form read ('In case of dtype change, perform conversion on source "
             "device': `src.to(dst_.dtype())`) and the newest (`src_.to(dst_.dtype())` before `expand_as`) alike [src]")


def placement_key(call) -> tuple | None:
    """What of a call the placement judgement reads (which tensors are on the host, with a source or not, which of
    them 0-dim), for predict_call's cache; None when no tensor of the call is."""
    if not any(t.host for t in call.inputs) and not any(t.host for t in call.outputs):
        return None
    return (tuple((t.host, bool(t.host_from), not t.shape) for t in call.inputs), tuple(t.host for t in call.outputs))


def is_placement(classification: Classification) -> bool:
    """Whether the placement model decided a verdict (a placement error or unknown: the user's code, not MPS)."""
    return classification.hardware is not None


def placed(call, kb, found: Classification) -> Classification:
    """`found` (the call's verdict as if all its tensors were on MPS), judged as the user's code places them."""
    inputs = call.inputs
    if not any(t.host for t in inputs) and not any(t.host for t in call.outputs):
        return found
    if all(t.host for t in (*inputs, *call.outputs)):
        return Classification(Verdict.NATIVE, Evidence(
            HOST_RULE, f"every tensor of this call stays on the CPU on a Mac ({_hosts(inputs or call.outputs)}): "
                       f"the CPU's kernel runs it, as in the trace, not an MPS one", _SOURCE))
    cast = _cast_on_host(call, kb)
    if cast is not None:
        return cast
    if not any(t.host and t.host_from for t in inputs) or found.verdict not in _JUDGED:
        return found  # (a composite's wrapped scalar, a host tensor with no source: PyTorch's own, as traced)
    rule = placement_rule(call.op, kb.release, _in_table(kb.yaml))
    if rule is None:
        return _unknown(call, kb, "how its MPS kernel takes a CPU tensor is not established (no rule in "
                                  "knowledge/placement.yaml; MPS kernels have no common-device check of their own: "
                                  "torchgen generates one for CUDA and XPU only)", _SOURCE, found)
    refused, open_ = _sort(rule, inputs)
    if refused:
        what, message = refused[0]
        path = rule.path.name if rule.path is not None else "its own check"
        text = (f"{what} stays on the CPU on a Mac and reaches {call.op.display}'s MPS kernel, which refuses it "
                f"({path}): \"{message}\" (torch {kb.release}); your step as written raises there")
        return Classification(Verdict.ERROR, Evidence(
            PLACEMENT_PREFIX + rule.id, text, f"{rule.source}; {(rule.path and rule.path.source) or _SOURCE}"),
            REMEDY, hardware=found)
    if open_:
        return _unknown(call, kb, f"whether its MPS kernel takes {open_[0]} on the CPU is not established "
                                  f"(placement rule {rule.id})", rule.source, found)
    return found


def _cast_on_host(call, kb) -> Classification | None:
    """A copy from a host tensor of a dtype MPS lacks (NumPy's float64) into a device tensor of one it has: MPS's
    copy converts the source to the destination's dtype on the CPU first, in every release, so the copy runs."""
    if call.op.name not in _COPIES:
        return None
    sources, targets = (call.inputs[1:], call.inputs[:1]) if call.op.name == "copy_" else (call.inputs, call.outputs)
    if not sources or not targets or any(t.host for t in targets) or not all(t.host for t in sources):
        return None
    if not lacks_dtype([t.dtype for t in sources], kb) or lacks_dtype([t.dtype for t in targets], kb):
        return None
    return Classification(Verdict.NATIVE, Evidence(
        CAST_RULE, f"a {sources[0].dtype} tensor on the CPU copied into a {targets[0].dtype} MPS tensor: MPS's copy "
                   f"converts it on the CPU first, so no {sources[0].dtype} tensor exists on MPS (torch {kb.release})",
        _SRC_CAST))


def _sort(rule, inputs) -> tuple[list[tuple[str, str]], list[str]]:
    """(refused host tensors as (what, message), host tensors whose fate is open) of a call under `rule`."""
    refused, open_, scalars = [], [], 0
    for t, group in zip(inputs, _groups(rule.arguments, len(inputs))):
        if not t.host or not t.host_from:
            continue
        zero = not t.shape
        what = f"a {'0-dim ' if zero else ''}{t.dtype} tensor {list(t.shape)}" + (
            f" ({group})" if group != "all" else "")
        how = rule.takes.get(group, rule.takes.get("all"))
        if how == "any" or (how == "zero-dim" and zero):
            continue
        if how == "cpu-scalar" and zero:
            scalars += 1
            if scalars == 1:
                continue
            refused.append((what, "Trying to pass too many CPU scalars to non-CPU kernel!"))
            continue
        unsure = rule.unknown.get(group, rule.unknown.get("all"))
        if unsure == "any" or (unsure == "zero-dim" and zero):
            open_.append(what)
        else:
            refused.append((what, rule.message))
    return refused, open_


def _groups(arguments: tuple[str, ...], n: int) -> list[str]:
    """The argument group of each of a call's `n` tensors: `arguments` in order, a starred name taking every tensor
    between the names before it and those after it; tensors no name covers are "all"."""
    star = next((i for i, a in enumerate(arguments) if a.endswith("*")), None)
    if star is None:
        return [arguments[i] if i < len(arguments) else "all" for i in range(n)]
    head, tail = list(arguments[:star]), list(arguments[star + 1:])
    middle = n - len(head) - len(tail)
    if middle < 0:
        return (head + tail)[:n]
    return head + [arguments[star][:-1]] * middle + tail


def _unknown(call, kb, reason: str, source: str, found: Classification) -> Classification:
    return Classification(Verdict.UNKNOWN, Evidence(
        UNKNOWN_RULE, f"{_hosts(call.inputs)} stays on the CPU on a Mac and reaches {call.op.display}'s MPS kernel "
                      f"(torch {kb.release}): {reason}", source), REMEDY, hardware=found)


def _hosts(tensors) -> str:
    hosts = [t for t in tensors if t.host]
    first = hosts[0] if hosts else None
    if first is None:
        return "no tensor"
    text = f"a {'0-dim ' if not first.shape else ''}{first.dtype} tensor {list(first.shape)}"
    return text + (f" and {len(hosts) - 1} more" if len(hosts) > 1 else "")


def _in_table(table):
    """in_table(name, ops) for placement_rule at the release of `table` (knowledge/optable.py): the overload's
    structured delegate is among `ops`, or it is among them and some overload of the release delegates to it."""
    def check(name: str, ops) -> bool:
        entry = table.get(OpKey.from_yaml(name))
        if entry is None:
            return False
        if entry.structured_delegate is not None:
            return entry.structured_delegate.yaml_name in ops
        return name in ops and name in _delegated(table)
    return check


@functools.lru_cache(maxsize=8)
def _delegated(table) -> frozenset[str]:
    """The overloads some overload of the release names as its structured delegate."""
    return frozenset(ref[1:] for _, ref in table.raw.values() if ref and ref[0] == "<")
