#!/usr/bin/env python3
"""Map PyTorch's OpInfo names (the keys of common_mps.py's lists) to the aten overloads they dispatch.

    python tools/build_opinfo_map.py            # writes opscan/knowledge/opinfo_map.txt
    python tools/build_opinfo_map.py --check    # compare with the shipped file

Needs the installed torch with its test helpers (`pip install expecttest`). For every OpInfo of
`torch.testing._internal.common_methods_invocations.op_db` it runs up to SAMPLES sample inputs on the
CPU in float32 (or the OpInfo's first CPU dtype) under a TorchDispatchMode and records the top-level
aten overloads each sample dispatches, then attributes the OpInfo to overloads by one method:

* `name`: the dispatched overloads whose name spells the OpInfo's (common_mps.opinfo_candidates),
  plus CompositeImplicitAutograd overloads with an MPS kernel that spell it (`linear`, `max_pool2d`:
  the CPU decomposes them, MPS runs them: the MPS view shows them);
* `samples`: else the overloads at least half of its samples dispatch, that at most RARE OpInfos
  dispatch at all (so `view`, `copy_`, `empty` never carry another op's expectation) and that share
  a word of at least four letters with the OpInfo's name (`nn.functional.avg_pool1d` ->
  `avg_pool2d`, `nn.functional.logsigmoid` -> `log_sigmoid_forward`; `stft`'s `reflection_pad1d`
  and `local_response_norm`'s `avg_pool2d` are not its own);
* `none`: nothing could be attributed (samples failed, or only common ops ran): that OpInfo's
  expectations are not applied to any aten op.

The MPS view's device branches are recorded too, qualified by the input's rank (`mps_branch`:
`nn.functional.conv_transpose3d` -> `_mps_convolution_transpose@5`), and attributed by `samples`, so
an expectation reaches the op MPS runs for that rank only.

Complex support is a positive claim and is recorded apart: for every OpInfo tested in complex64 on
MPS, up to COMPLEX_SAMPLES of its complex64 samples run the same way, and a `dispatch` line lists
every overload (and MPS-view branch) that received or returned a complex tensor, with no filter: when
SUPPORTED_COMPLEX_OPS names the OpInfo, its test ran each of them on MPS in complex64 and passed
(`fft.irfft2` -> `_fft_c2r`, `fft.fft` -> `_fft_c2c`; composites such as `fft_irfft2` reach the
dispatch mode already decomposed, so the ops they reach are the ones recorded). dtype_rules.py
reads them only for complex inputs.

An OpInfo failing for int64 therefore marks only the op that is characteristic of it, never every
op its samples touch. Each line also keeps the dtypes the OpInfo is tested in on MPS
(`supported_dtypes("mps")`): classify.py flags a dtype only when every OpInfo mapped to the op that
is tested in that dtype expects it to fail. The map is recorded on one torch release (named in the file) and applied to
every release from 2.8.0 (the first whose wheel ships common_mps.py); OpInfos that the recording
release lacks are not mapped.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from table_output import write_or_check  # noqa: E402
from opscan.knowledge.common_mps import opinfo_candidates  # noqa: E402
from opscan.knowledge.opinfo import MAP_PATH, format_map  # noqa: E402
from opscan.opkey import OpKey  # noqa: E402

SAMPLES = 6
COMPLEX_SAMPLES = 12
COMPLEX = "complex64"
RARE = 4
_GENERIC = frozenset({"forward", "backward", "grad", "with", "indices", "tensor", "scalar", "functional", "out"})


def words(name: str) -> set[str]:
    """Lower-case words of four letters or more, generic ones dropped."""
    found = {w for w in re.split(r"[^a-z]+", name.lower()) if len(w) >= 4}
    return found - _GENERIC


def related(opinfo: str, overload: str) -> bool:
    """Whether a word of one name contains a word of the other."""
    return any(a in b or b in a for a in words(opinfo) for b in words(overload))


class _Recorder:
    """A TorchDispatchMode factory (torch is imported late): records the aten overloads dispatched at the
    top level (`seen`), and those that received or returned a tensor of dtype `marked` (`marked_seen`)."""

    def __new__(cls, marked=None):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        class Recorder(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen: set[str] = set()
                self.marked_seen: set[str] = set()

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                key = OpKey.of(func)
                if key.namespace == "aten":
                    names = {key.yaml_name, *mps_branch(key.yaml_name, args)}
                    self.seen.update(names)
                    leaves = tree_leaves((args, kwargs or {}, out))
                    if marked is not None and any(getattr(t, "dtype", None) == marked for t in leaves):
                        self.marked_seen.update(names)
                return out

        return Recorder()


def record_samples(op, torch, dtype=None, limit: int = SAMPLES, marked: bool = False) -> tuple[str, list[set[str]]]:
    """(dtype, [overloads dispatched by each sample]) for one OpInfo, in `dtype` (default: float32 or its
    first CPU dtype); `marked`: only the overloads that received or returned a tensor of that dtype."""
    if dtype is None:
        supported = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in supported else min(supported, key=str, default=None)
    if dtype is None:
        return "-", []
    runs = []
    torch.manual_seed(0)  # sample values (hence a data-dependent path) are the same on every run
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:limit]
    except Exception:  # noqa: BLE001 - a broken sample generator maps nothing
        return str(dtype).removeprefix("torch."), []
    for sample in samples:
        recorder = _Recorder(dtype if marked else None)
        try:
            with recorder:
                op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - a failing sample tells nothing
            continue
        runs.append(recorder.marked_seen if marked else recorder.seen)
    return str(dtype).removeprefix("torch."), runs


def mps_branch(name: str, args) -> tuple[str, ...]:
    """The MPS view's op for a device-branching call, qualified by its input's rank (`OP@RANK`):
    `convolution` -> `_mps_convolution@4` or `_mps_convolution_transpose@5` (mps_view.py, rule
    mps-convolution). One MPS kernel serves every rank, and PyTorch's expectations differ per rank
    (conv_transpose3d fails in float16, conv_transpose2d does not), so the rank keeps them apart."""
    if name != "convolution" or len(args) < 7 or not hasattr(args[0], "dim"):
        return ()
    op = "_mps_convolution_transpose" if args[6] else "_mps_convolution"
    return (f"{op}@{args[0].dim()}",)


def attribute(name: str, runs: list[set[str]], df: Counter, cia_mps: set[str]) -> tuple[str, list[str]]:
    """(method, overloads) for one OpInfo; see the module docstring."""
    seen = set().union(*runs) if runs else set()
    spelled = {o for o in seen | cia_mps if "@" not in o and name in opinfo_candidates(OpKey.from_yaml(o).name)}
    if spelled:
        return "name", sorted(spelled)
    common = [o for o in seen
              if sum(o in r for r in runs) * 2 >= len(runs) and df[o] <= RARE and related(name, o)]
    return ("samples", sorted(common)) if common else ("none", [])


def build() -> str:
    """The text of opinfo_map.txt for the installed torch."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from opscan.knowledge.build import read_installed
    from opscan.knowledge.optable import OpTable

    files = read_installed()  # not load_knowledge(): that reads the map this tool writes
    cia_mps = {o.yaml_name for o in OpTable.from_records(files.records(), "installed", "-").cia_with_mps()}
    release = torch.__version__.split("+", 1)[0]
    recorded, mps_dtypes, dispatched = {}, {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            name = op.name + op.variant_test_name
            recorded[name] = record_samples(op, torch)
            mps_dtypes[name] = sorted(str(d).removeprefix("torch.") for d in op.supported_dtypes("mps"))
            if COMPLEX in mps_dtypes[name]:
                dispatched[name] = record_samples(op, torch, torch.complex64, COMPLEX_SAMPLES, marked=True)
    df = Counter(o for _, runs in recorded.values() for o in set().union(*runs) if runs)
    rows = {}
    for name, (dtype, runs) in recorded.items():
        method, overloads = attribute(name, runs, df, cia_mps)
        rows[name] = (dtype, len(runs), method, mps_dtypes[name], overloads)
    complex_rows = {name: (len(runs), sorted(set().union(*runs))) for name, (_, runs) in dispatched.items() if runs}
    return format_map(release, torch.version.git_version, rows, {COMPLEX: complex_rows})


def main(argv: list[str] | None = None) -> int:
    """Write (or --check) opinfo_map.txt."""
    p = argparse.ArgumentParser(prog="build_opinfo_map.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing")
    p.add_argument("--output", default=MAP_PATH)
    args = p.parse_args(argv)
    text = build()
    return write_or_check("build_opinfo_map", args.output, text, args.check)


if __name__ == "__main__":
    sys.exit(main())
