#!/usr/bin/env python3
"""Every TORCH_WARN compiled into the MPS kernels of each covered release's libtorch_cpu.dylib, and what opscan does
with it: the complete list of the CPU fallbacks inside MPS kernels.

An MPS kernel that runs a call on the CPU itself (a copy of its inputs, the CPU op, the result copied back) warns once
("... Falling back on CPU", "... supported by MPS on MacOS 13+, please upgrade", "... falling back to CPU."); a
fallback that warns nothing has no site and is not found here. kernel_checks.txt lists the TORCH_CHECKs; this tool
reads the warnings the same way (tools/macho_checks.py: every call of c10::warn whose function loads the path of a
source file under aten/src/ATen/native/mps/, with the C strings it passes) and groups them over the releases whose
dylib holds them. Each warning is then

* `rule ID`: the message of a kernel_rules.yaml `fallbacks` entry (rule 4d), which must cover exactly the releases
  whose dylib holds it, except releases where none of its ops has an MPS kernel (a message shared with an older op);
* `not a fallback: WHY`: a warning NOT_FALLBACKS explains (a cast on MPS, a deprecation, a composite run on MPS);
* `UNACCOUNTED`: neither. `--check` exits 1 when there is one, or when a rule's releases differ from the dylibs'.

    python tools/kernel_fallback_strings.py --dylib-dir DIR            # DIR/<release>/torch/lib/libtorch_cpu.dylib
    python tools/kernel_fallback_strings.py --wheel-dir DIR --check    # the wheels index.txt names, in DIR

Releases absent from DIR are skipped and named (rules are compared on the releases read). About 20 s a dylib.
No torch import. Exit codes: 0 done, 1 --check found an unaccounted warning or a range mismatch, 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opscan.knowledge.kernel_rules import load_kernel_rules  # noqa: E402

DYLIB = "torch/lib/libtorch_cpu.dylib"
# Warnings of MPS sources that are not a CPU fallback inside the kernel, and why (a regex over the joined message).
NOT_FALLBACKS: tuple[tuple[str, str], ...] = (
    (r"downcasting to a smaller data type \(int32/float32\)", "a cast to int32/float32 on MPS, no CPU"),
    (r"no support for int64 repeats mask, casting it to int32", "a cast to int32 on MPS, no CPU"),
    (r"no support for int64 (?:min/max|reduction) ops?, casting it to int32", "a cast to int32 on MPS, no CPU"),
    (r"constant padding of more than 3 dimensions is not currently supported natively",
     "Pad.mm runs the composite constant_pad_nd (view ops) on MPS, no CPU"),
    (r"Falling back to LSTMCell iteration",
     "RNN.cpp runs a multi-layer LSTM as LSTMCell steps on MPS below macOS 13 (composites of native ops), no CPU"),
    (r"The number of elements in the out tensor of shape", "the out= tensor is resized: a warning, not a path"),
    (r"received a uint8 condition tensor\. This behavior is deprecated", "a deprecation notice"),
    (r"deprecated|will be removed", "a deprecation notice"),
    (r"non-deterministic|nondeterministic", "a determinism notice"),
    (r"^operator\(\)$", "no message"),
    (r"momentum == 0|`is_first_step` argument has no effect", "a notice of the fused SGD kernel, which runs on MPS"),
    (r"Dispatching to metal implementation instead", "LinearAlgebra.mm runs its own Metal matmul on MPS, no CPU"),
    (r"is in beta and the API may change", "a notice"),
)
_NOT = tuple((re.compile(p, re.I), why) for p, why in NOT_FALLBACKS)


def _norm(text: str) -> str:
    """The text before "Falling back on CPU" (2.0's says "performace"), its fragments joined, spaces collapsed."""
    return " ".join(text.split("Falling back on CPU")[0].replace(" … ", " ").split()).rstrip(".").rstrip()


def _parts(message: str) -> list[str]:
    """A rule's message split at its %s placeholders, normalized."""
    return [_norm(part) for part in message.split("%s")]


def site_message(site) -> str:
    """A warning site's message: its C strings, `__func__` names left out."""
    return " … ".join(p for p in site.parts if p != "operator()")


def warnings_of(data: bytes) -> dict[str, str]:
    """message -> source file name, for every TORCH_WARN site of the MPS sources in one dylib."""
    from macho_checks import find_sites, load

    out = {}
    for site in find_sites(data, load(data)):
        if site.macro == "TORCH_WARN" and (message := site_message(site)):
            out.setdefault(message, site.file.rsplit("/", 1)[-1])
    return out


def rule_of(message: str, rules):
    """The fallbacks rule whose message this warning's is, or None: the warning starts with the rule's text before
    its first placeholder (or, for a rule that starts with one, its first C string is the rule's next text), and
    holds every other piece of 8 characters or more."""
    text, first = _norm(message), _norm(message.split(" … ")[0])
    for rule in rules:
        parts = _parts(rule.message)
        starts = text.startswith(parts[0]) if parts[0] else len(parts) > 1 and first == parts[1]
        if starts and all(p in text for p in parts if len(p) >= 8):
            return rule
    return None


def classify(message: str, rules) -> str:
    """`rule ID`, `not a fallback: WHY` or `UNACCOUNTED` for one warning."""
    rule = rule_of(message, rules)
    if rule is not None:
        return f"rule {rule.id}"
    for pattern, why in _NOT:
        if pattern.search(message):
            return f"not a fallback: {why}"
    return "UNACCOUNTED"


def read_dylib(folder: str, release: str, wheel: str) -> bytes | None:
    """The release's libtorch_cpu.dylib from DIR/<release>/torch/lib, or from its wheel in DIR (None: absent)."""
    path = os.path.join(folder, release, DYLIB)
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            return fh.read()
    path = os.path.join(folder, wheel)
    if os.path.isfile(path):
        with zipfile.ZipFile(path) as zf:
            return zf.read(DYLIB)
    return None


def range_text(members, order: list[str]) -> str:
    from opscan.knowledge.kernel_checks import ranges

    return ranges(set(members), order) or "-"


def rule_mismatches(rules, held: dict[str, dict[str, str]], read: list[str], has_kernel) -> list[str]:
    """Rules whose releases differ from the read releases whose dylib holds their message (a release where none of
    the rule's ops has an MPS kernel may hold it for another op: `has_kernel(release, ops)` says)."""
    out = []
    for rule in rules:
        holders = {r for r in read if any(rule_of(m, (rule,)) for m in held[r])}
        claimed = {r for r in read if rule.releases.covers(r)}
        extra = {r for r in holders - claimed if has_kernel(r, rule.ops)}
        if extra or claimed - holders:
            out.append(f"{rule.id}: the dylibs of {range_text(holders, read)} hold its message, "
                       f"it covers {range_text(claimed, read)}")
    return out


def _has_kernel(release: str, ops) -> bool:
    from opscan.knowledge import load_knowledge
    from opscan.opkey import OpKey

    yaml = load_knowledge(release=release).yaml
    return any(yaml.mps_kernel(OpKey.parse(f"aten::{op}")) is not None for op in ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--dylib-dir", help="DIR/<release>/torch/lib/libtorch_cpu.dylib per release")
    where.add_argument("--wheel-dir", help="the macOS wheels index.txt names")
    parser.add_argument("--check", action="store_true", help="exit 1 on an unaccounted warning or a range mismatch")
    parser.add_argument("--release", action="append", help="read only these releases (repeatable)")
    args = parser.parse_args(argv)
    from opscan.knowledge.entry import load_store

    folder = args.dylib_dir or args.wheel_dir
    order = [line.release for line in load_store().index]
    held: dict[str, dict[str, str]] = {}
    for line in load_store().index:
        if args.release and line.release not in args.release:
            continue
        data = read_dylib(folder, line.release, line.wheel)
        if data is not None:
            held[line.release] = warnings_of(data)
    read = [r for r in order if r in held]
    if not read:
        print(f"kernel_fallback_strings: no dylib or wheel of a covered release in {folder}", file=sys.stderr)
        return 2
    rules = load_kernel_rules().fallbacks
    members: dict[str, list[str]] = {}
    for release in read:
        for message in held[release]:
            members.setdefault(message, []).append(release)
    unaccounted = 0
    for message in sorted(members, key=lambda m: (classify(m, rules), m)):
        status = classify(message, rules)
        unaccounted += status == "UNACCOUNTED"
        where = next(held[r][message] for r in members[message])
        print(f"{range_text(members[message], read)}\t{where}\t{status}\t{message}")
    mismatches = rule_mismatches(rules, held, read, _has_kernel)
    for line in mismatches:
        print(f"MISMATCH\t{line}")
    missing = [r for r in order if r not in held]
    if missing:
        print(f"# not read: {', '.join(missing)}")
    print(f"kernel_fallback_strings: {len(read)} releases, {len(members)} warnings, {unaccounted} unaccounted, "
          f"{len(mismatches)} rule range mismatches")
    return 1 if args.check and (unaccounted or mismatches) else 0


if __name__ == "__main__":
    sys.exit(main())
