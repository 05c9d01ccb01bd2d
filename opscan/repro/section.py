"""Repro stage: the report's `repro` section — what a repro script of each finding needs, from report.json alone.

A finding is a row whose verdict ranks above `native`, or whose `measured` block does (a measurement on
cpu or cuda is a finding about that device); a row's placement findings are not (the user's bug, not PyTorch's).
For each, up to MAX_CALLS of the probe calls that stand for
it (ProbeCall.to_dict(): op, tensor specs with recorded integer values, arguments, seed), the input values
that opscan made at generation time where none were recorded (op_probes builders, small random integers:
computed here with the probe worker's own replay.build, so the script needs no opscan), which outputs are
compared by their properties, and, when measured, each call's outcome on the measured device with the
exit code its script should give there. Built in the parent process (torch imported), never in a worker.
"""

from __future__ import annotations

import base64
import shlex
import zlib

from opscan.opkey import TORCH_NAMESPACES
from opscan.target.inputs import arg_words
from opscan.verdict import Verdict

MAX_CALLS = 4  # probe calls kept per finding row (the worst first)
PACK_ABOVE = 256  # more values are stored zlib-compressed (little-endian, row-major): here and in the scripts
SECTION_VERSION = 1
EXPECTED = {0: "passes", 1: "reproduces", 2: "cannot-run"}


def command_line(options) -> str:
    """The `opscan` command that makes this scan again: every ScanOptions / ProbeOptions field a flag sets that
    changes what is traced, predicted or measured (defaults left out), quoted as a shell would (shlex). An --arg
    value is written only for a name the user marked with --public-arg (`--arg token=<redacted>` otherwise)."""
    parts = ["opscan", options.target]
    parts += [x for text in options.inputs for x in ("--input", text)]
    parts += arg_words(options.args, options.public_args)  # names only, unless marked public: a token stays out
    parts += ["--inference"] if options.inference else []
    parts += ["--dtype", options.dtype] if options.dtype else []
    parts += ["--no-fx"] if not options.fx else []
    parts += ["--fake"] if options.fake else ["--no-fake"] if not options.auto_fake else []
    parts += ["--torch-version", options.torch_version] if options.torch_version else []
    parts += ["--macos", options.macos] if options.macos else []
    return shlex.join(parts + _probe_flags(options.probe) + ["--repro"])


def _probe_flags(probe) -> list[str]:
    """--no-probe, or --probe --device D with the shape cap and the per-probe limit when not the defaults."""
    from opscan.probe.stage import DEFAULT_MAX_ELEMENTS, ProbeOptions

    if probe is None:
        return ["--no-probe"]
    parts = ["--probe", "--device", probe.device]
    if probe.max_elements is None:
        parts += ["--full-shapes"]
    elif probe.max_elements != DEFAULT_MAX_ELEMENTS:
        parts += ["--max-elements", str(probe.max_elements)]
    if probe.timeout != ProbeOptions.timeout:
        parts += ["--probe-timeout", repr(float(probe.timeout))]
    return parts


def is_finding(row) -> bool:
    """A row worth a repro: its verdict, or its measured verdict, ranks above native — apart from its placement
    findings (a host tensor the user's code hands an MPS kernel: their bug, not PyTorch's, so no upstream script or
    ISSUE.md is written for it; report/placement.py)."""
    if getattr(row, "placement", None) is not None:
        return row.lane_verdict.rank > 0
    measured = (row.measured or {}).get("verdict")
    return row.verdict.rank > 0 or (measured is not None and Verdict(measured).rank > 0)


def section(rows, plan, result=None, label: str | None = None, command: str = "") -> dict:
    """The `repro` section for the finding rows of a report, from the probe plan (and its outcomes when
    measured on `label`)."""
    probes = {p.id: p for p in plan.probes}
    findings = [_finding(i, row, plan, probes, result, label) for i, row in enumerate(rows) if is_finding(row)]
    return {"version": SECTION_VERSION, "command": command, "measured_on": label, "findings": findings}


def _finding(index: int, row, plan, probes: dict, result, label) -> dict:
    ids = plan.rows.get((row.op, row.dtypes), ())
    runnable = sorted((pid for pid in ids if pid in probes), key=lambda pid: -_badness(pid, result))
    return {
        "row": index, "op": row.op.display, "dtypes": list(row.dtypes), "verdict": row.verdict.value,
        "measured_verdict": (row.measured or {}).get("verdict"), "evidence": row.evidence.text,
        "shapes": [list(s) for s in row.shapes],
        "calls": [call_entry(probes[pid], result, label) for pid in runnable[:MAX_CALLS]],
        "more_calls": max(0, len(runnable) - MAX_CALLS),
        "unreplayable": sorted({plan.unreplayable[pid] for pid in ids if pid in plan.unreplayable}),
    }


def _badness(pid: str, result) -> int:
    if result is None or pid not in result.off:
        return 0
    from opscan.probe.decide import decide

    return decide(result.off[pid], result.on.get(pid)).verdict.rank


def call_entry(probe, result=None, label: str | None = None) -> dict:
    """One call of a finding: the probe as it ran (capped shapes when the worker used them), what opscan
    made for it, and its outcome on `label` when measured."""
    from opscan.probe import shrink

    off = result.off.get(probe.id) if result is not None else None
    on = result.on.get(probe.id) if result is not None else None
    ran, original = probe, None
    if off is not None and (off.extra or {}).get("shapes") == "capped" and probe.shrink:
        ran, original = shrink.apply(probe), [list(t.shape) for t in probe.tensors]
    entry = {"probe": ran.to_dict(), "original_shapes": original, **prepared(ran)}
    if off is not None and off.status == "unbuildable":
        entry = {**entry, "unbuildable": off.message}
    entry["outcomes"] = {label: outcome_entry(off, on)} if off is not None else {}
    return entry


def prepared(call) -> dict:
    """{"inline": {tensor index: packed values}, "properties": "all" | [output positions]} (and "feed_inline",
    the same for the tensors of the call's feed) — or {"unbuildable": why} when the probe's inputs cannot be built
    here either."""
    from opscan.probe import comparison, replay
    from opscan.probe.protocol import ProbeCall
    from opscan.probe.rebuild import BuildError

    namespace = call.op.partition("::")[0]
    if namespace not in TORCH_NAMESPACES:
        return {"unbuildable": f"{call.op} is not one of torch's own operators (namespace {namespace!r}): a script "
                               "that needs only torch cannot define it"}
    try:
        func = replay.resolve(call.op)
        built = replay.build(call, func)
    except BuildError as exc:
        return {"unbuildable": str(exc)}
    inline = _inline(call, built)
    positions = [p for p in range(8) if comparison.how_for(func, p) == "properties"]
    found = {"inline": inline, "properties": "all" if len(positions) == 8 else positions}
    fed, _ = replay.feed_of(call)
    if fed is not None:  # the forward that makes some inputs: its own builder-made values, for the script
        forward = ProbeCall(call.id, call.feed.op, call.feed.tensors, call.feed.spec, call.feed.seed)
        found["feed_inline"] = _inline(forward, fed.tensors)
    return found


def _inline(call, built) -> dict:
    """{tensor index: packed values} of the built tensors a script's seeded rebuild would not make itself."""
    import torch

    from opscan.probe.rebuild import initial

    generator = torch.Generator().manual_seed(call.seed)
    seeded = [initial(s.dtype, s.shape, s.stride, s.values, generator)[0] for s in call.tensors]  # as the script
    return {str(i): pack(b) for i, (s, b) in enumerate(zip(seeded, built))
            if call.tensors[i].values is None and not _same(s, b)}


def _same(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and bool(torch.equal(a.contiguous(), b.contiguous()))


def pack(tensor) -> dict:
    """Row-major values: {"values": nested list} when small, else {"zlib_base64": little-endian bytes}."""
    dense = tensor.contiguous()
    if dense.numel() <= PACK_ABOVE and not dense.is_floating_point() and not dense.is_complex():
        return {"values": dense.tolist()}
    return {"zlib_base64": base64.b64encode(zlib.compress(_raw(dense), 9)).decode("ascii")}


def _raw(dense) -> bytes:
    """The tensor's bytes in memory order (little-endian on every machine torch ships for)."""
    import torch

    flat = dense.reshape(-1).view(torch.uint8)
    try:
        return flat.numpy().tobytes()
    except (ImportError, RuntimeError, TypeError):  # a torch without numpy
        return bytes(flat.tolist())


def outcome_entry(off, on=None) -> dict:
    """A measured call's outcome (the off pass: what the script sees with the fallback variable unset)."""
    comparison = off.comparison
    first = (off.message or "").strip().splitlines()
    code = expected_exit(off)
    return {
        "status": off.status, "exc_type": off.exc_type, "message": first[0][:400] if first else None,
        "fallback_seen": off.fallback_seen, "signal": off.signal,
        "within": comparison.within if comparison and comparison.checked else None,
        "max_abs": comparison.max_abs if comparison else None,
        "max_rel": comparison.max_rel if comparison else None,
        "reference": comparison.reference if comparison else None,
        "detail": comparison.detail if comparison else None,
        "shapes": (off.extra or {}).get("shapes"),
        "on": None if on is None else {"status": on.status, "exc_type": on.exc_type, "fallback_seen": on.fallback_seen,
                                       "message": ((on.message or "").strip().splitlines() or [None])[0]},
        "expected_exit": code,
        "expected": EXPECTED.get(code, off.status),
    }


def expected_exit(off) -> int | None:
    """The script's exit code for this outcome: 0 agreed, 1 reproduced, 2 cannot run; None for a crash or a
    timeout (the process dies, or outlives its limit)."""
    if off.status == "ran":
        beyond = off.comparison is not None and off.comparison.beyond
        return 1 if beyond or off.fallback_seen else 0
    return {"raised": 1, "unbuildable": 2}.get(off.status)
