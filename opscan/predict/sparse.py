"""Predict stage: calls with a sparse tensor (COO, CSR, CSC, BSR, BSC) are never judged by the dense kernel.

Sparse tensors are out of opscan's scope (contract, "say so when met"), but what a release registers for them
is in its native_functions.yaml: `SparseMPS` (COO) and `SparseCsrMPS` (compressed layouts) dispatch keys, kept as
the S and C flags of the knowledge base's `op` records. They first appear in 2.9.0 (none in 2.0.0-2.8.0:
pytorch#129842, #141320). A call with a sparse input or output gets:

* `sparse-no-mps-backend` (`unsupported`): the release registers no kernel at all for that sparse layout family
  on MPS, so the tensor cannot be used there;
* `sparse-mps-kernel` (`native`): the op has a kernel for the layout's key in that release;
* `sparse-composite-path` (the worst of its ops): a composite whose branch for a sparse COO input
  knowledge/composite_paths.yaml `sparse_paths` lists (`t`, `transpose`: clone, _indices, _coalesced_), each op of
  it judged here with the same layout;
* `sparse-not-modelled` (`unknown`, "sparse layout: not modelled"): otherwise (no kernel of its own for the key:
  a composite, or an op that may raise or fall back; opscan does not model which).

No torch import; the release tables come from the knowledge base (the remedy's first release with a key
reads the other releases' entries once).
"""

from __future__ import annotations

import functools

from opscan.knowledge import Knowledge
from opscan.opkey import OpKey
from opscan.knowledge.callees import SPARSE, callees
from opscan.predict.composite import worst_decides
from opscan.predict.dtype_rules import CHECK_ON_MAC, result
from opscan.verdict import Classification, Verdict

COMPRESSED = frozenset({"sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc"})
_KEY = {"S": "SparseMPS", "C": "SparseCsrMPS"}
_ISSUES = "pytorch#129842, pytorch#141320"
_DENSE = "keep the sparse tensor and the ops on it on the CPU, or make it dense (to_dense()) before it reaches MPS"


def sparse_layouts(call) -> tuple[str, ...]:
    """The sparse layouts among a call's input and output tensors (empty for a dense call)."""
    found = {t.layout for t in (*call.inputs, *call.outputs) if getattr(t, "sparse", False)}
    return tuple(sorted(found))


def predict_sparse(op, layouts: tuple[str, ...], kb: Knowledge) -> Classification:
    """The verdict of an aten call with sparse tensors of `layouts` in kb's release."""
    flag = "C" if set(layouts) <= COMPRESSED else "S"
    key = _KEY[flag]
    named = "/".join(layouts)
    if not _backend(kb, flag):
        text = (f"{op} gets a {named} tensor, and {kb.yaml_source} registers no {key} kernel for any op: torch "
                f"{kb.release} has no sparse backend on MPS for that layout ({_ISSUES}), so the sparse tensor "
                f"cannot be used there; sparse layouts are otherwise out of opscan's scope")
        first = _first_release(kb, flag)
        upgrade = f"; torch {first} is the first release with {key} kernels" if first else ""
        return result(Verdict.UNSUPPORTED, "sparse-no-mps-backend", text, f"{kb.yaml_source} ({key} keys)",
                      f"{_DENSE}{upgrade}")
    flags = kb.yaml.raw.get(op.yaml_name, ("", None))[0] if op.namespace == "aten" else ""
    if flag in flags:
        text = (f"{op} gets a {named} tensor, and {kb.yaml_source} registers a {key} kernel for it (predicted for "
                f"torch {kb.release}; only the registration is read: sparse layouts are otherwise not modelled)")
        return result(Verdict.NATIVE, "sparse-mps-kernel", text, f"{kb.yaml_source} ({key} keys)")
    branch = callees(op, kb, SPARSE) if flag == "S" else None
    if branch is not None:
        return _branch(op, layouts, kb, branch)
    text = (f"sparse layout: not modelled. {op} gets a {named} tensor; torch {kb.release} registers {key} kernels, "
            f"but none for {op}, and what it then does (composite, error or CPU fallback) is not modelled")
    return result(Verdict.UNKNOWN, "sparse-not-modelled", text, f"{kb.yaml_source} ({key} keys)",
                  f"{_DENSE}; {CHECK_ON_MAC}")


def _branch(op, layouts: tuple[str, ...], kb: Knowledge, branch) -> Classification:
    """A composite judged by the ops its body reaches for a sparse input, each with the same layouts."""
    judged = [(name, predict_sparse(OpKey.from_yaml(name), layouts, kb)) for name in branch.paths[0].calls]
    return worst_decides(judged, "sparse-composite-path", f"{op} gets a {'/'.join(layouts)} tensor; it is a "
                         "composite whose body, for a sparse input, calls ", " (composite_paths.yaml sparse_paths)",
                         branch.source, kb.release)


@functools.lru_cache(maxsize=64)
def _backend(kb: Knowledge, flag: str) -> bool:
    """Whether the release registers any kernel for the flag's sparse dispatch key (cached per knowledge base)."""
    return any(flag in flags for flags, _ in kb.yaml.raw.values())


@functools.lru_cache(maxsize=4)
def _first_release(kb: Knowledge, flag: str) -> str | None:
    """The first covered release registering kernels for the flag's key (for the remedy), or None."""
    from opscan.knowledge import kb_releases, load_knowledge

    for release in kb_releases():
        if _backend(load_knowledge(release=release), flag):
            return release
    return None
