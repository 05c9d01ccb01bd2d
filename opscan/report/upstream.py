"""Report stage: where a finding belongs besides the user's code — whether an upstream report (ISSUE.md) is worth
drafting, and what to link instead when it is not. Pure, no torch: a function of a finding's rule, verdict, ops and
evidence, so the report stage (report/findings.py) and the repro stage reading a report.json (repro/__init__.py)
decide alike.

| kind | when | ISSUE.md |
|---|---|---|
| `user-code` | a bug in the user's code (USER_CODE_RULES: a CPU tensor meeting MPS kernels, device picking) | no |
| `custom-op` | an op outside torch's namespaces: whose op it is (the scanned code's, torchvision's, a library's) | no |
| `documented` | a documented limitation: float64/complex128 (Metal has no 64-bit floats), half FFT, c10d | no |
| `fixed` | native in a later covered release (`since`): upgrade instead | no |
| `check` | `unknown`: opscan cannot decide; measure it on a Mac before reporting anything | no |
| `known` | the evidence cites PyTorch issues (`pytorch/pytorch #N`; a silent bug's `issues`): link them | no |
| `tracker` | no MPS kernel (or the always-CPU list): PyTorch asks for a comment on its tracking issue, #141287 | no |
| `report` | anything else: worth an upstream report, drafted as ISSUE.md | yes |
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from opscan.opkey import TORCH_NAMESPACES

TRACKER = 141287  # PyTorch's MPS op-coverage tracking issue (its NotImplementedError asks for a comment there)
OLD_TRACKER = 77764  # the one torch 2.0-2.5's message names
ISSUE_URL = "https://github.com/pytorch/pytorch/issues/{}"
UPSTREAM_KINDS = ("report", "known", "tracker", "documented", "fixed", "custom-op", "user-code", "check")
# rules whose findings are bugs in the user's code, never PyTorch's: exact ids, and prefixes ending in "-" (issue
# 33's placement and device-picking findings: a host tensor meeting MPS kernels, `.cuda()`, cuda-else-cpu)
USER_CODE_RULES = frozenset({"missing-api", "placement-", "host-tensor", "device-"})
DOCUMENTED = {
    "dtype-float64": "float64 and complex128 do not exist on MPS (Metal has no 64-bit floating types: a documented "
                     "limitation, not a bug)",
    "fft-half": "torch.fft in float16/bfloat16 runs only on CUDA (a documented limitation)",
    "c10d-no-fallback": "distributed collectives have no MPS backend (out of MPS's scope)",
    "c10d-out-of-scope": "distributed collectives have no MPS backend (out of MPS's scope)",
}
OWNERS = {"torchvision": ("torchvision's", "https://github.com/pytorch/vision/issues")}
# "pytorch/pytorch #97109, #143864", "pytorch/pytorch#1", "pytorch#129842, #141320", ".../pytorch/pytorch/issues/96056"
_CITED = re.compile(r"(?:github\.com/pytorch/pytorch/issues/|pytorch/pytorch ?#|\bpytorch#)"
                    r"(\d+)((?:,? ?(?:and )?#\d+)*)")


@dataclass(frozen=True)
class Upstream:
    """Where a finding goes upstream: `kind` (UPSTREAM_KINDS), a sentence saying so, and the links to follow instead."""

    kind: str
    text: str
    links: tuple[str, ...] = ()

    @property
    def issue(self) -> bool:
        """Whether an ISSUE.md is drafted for it."""
        return self.kind == "report"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a finding's `upstream`)."""
        return {"kind": self.kind, "issue": self.issue, "text": self.text, "links": list(self.links)}


def user_code_rule(rule: str) -> bool:
    """Whether `rule` marks a bug in the user's code (USER_CODE_RULES: an exact id, or a prefix ending in "-")."""
    return rule in USER_CODE_RULES or any(p.endswith("-") and rule.startswith(p) for p in USER_CODE_RULES)


def cited_issues(texts: Iterable[str]) -> tuple[int, ...]:
    """The PyTorch issue numbers `texts` cite (pull requests, "PR #N", are not issues), in order, once each."""
    found: list[int] = []
    for text in texts:
        for m in _CITED.finditer(str(text or "")):
            found += [int(m.group(1))] + [int(n) for n in re.findall(r"#(\d+)", m.group(2))]
    return tuple(dict.fromkeys(found))


def upstream_of(rule: str, verdict: str, ops: Iterable[str], since: str | None = None, texts: Iterable[str] = (),
                issues: Iterable[int] = (), also: Iterable[str] = (), dtypes: Iterable[str] = ()) -> Upstream:
    """Where a finding belongs upstream (see the module docstring): `ops` its ops' display names, `texts` its
    evidence texts and sources (predicted and measured), `issues` the issues its known silent bug lists, `also` the
    rules its rows were predicted by when measured (a probe's rule says less), `dtypes` its rows' dtypes."""
    ops, rules = list(ops), [rule, *also]
    foreign = [op for op in ops if op.partition("::")[0] not in TORCH_NAMESPACES]
    if any(user_code_rule(r) for r in rules):
        return Upstream("user-code", "a bug in the scanned code, not in PyTorch: fix it at this line; nothing to "
                                     "report upstream")
    if foreign:
        return _custom(foreign[0], next((r for r in rules if r.startswith("target-registration")), rule))
    documented = next((r for r in rules if r in DOCUMENTED), None)
    if documented is None and rule == "probe-dtype" and set(dtypes) & {"float64", "complex128"}:
        documented = "dtype-float64"  # measured: MPS refused a 64-bit dtype
    if documented:
        return Upstream("documented", f"{DOCUMENTED[documented]}: nothing to report upstream")
    if since:
        return Upstream("fixed", f"fixed upstream: native from torch {since}; upgrade rather than report it")
    if verdict == "unknown":
        return Upstream("check", "opscan cannot decide this one: measure it on a Mac (opscan bundle, or opscan "
                                 "TARGET --probe there) before reporting anything")
    cited = [n for n in (*issues, *cited_issues(texts)) if n not in (TRACKER, OLD_TRACKER)]
    if cited:
        numbers = list(dict.fromkeys(cited))
        return Upstream("known", "known upstream: " + ", ".join(f"pytorch/pytorch#{n}" for n in numbers)
                        + " — add your case there rather than filing a duplicate",
                        tuple(ISSUE_URL.format(n) for n in numbers))
    if verdict == "unsupported" or {"no-mps-kernel", "probe-unsupported"} & set(rules):
        return Upstream("tracker", f"PyTorch collects missing MPS ops on pytorch/pytorch#{TRACKER}: comment there "
                                   "with the op and your use case (its own error message asks for that) rather "
                                   "than filing a new issue", (ISSUE_URL.format(TRACKER),))
    if {"always-cpu", "probe-cpu-fallback"} & set(rules):
        return Upstream("tracker", "PyTorch runs this op on the CPU by design (MPSFallback.mm's always-CPU list): ask "
                                   f"for an MPS kernel on pytorch/pytorch#{TRACKER}, its MPS op-coverage tracker, "
                                   "rather than filing a new issue", (ISSUE_URL.format(TRACKER),))
    return Upstream("report", "worth reporting to PyTorch: --repro drafts an ISSUE.md with a minimal snippet")


def _custom(op: str, rule: str) -> Upstream:
    namespace = op.partition("::")[0]
    if rule.startswith("target-registration"):
        return Upstream("custom-op", f"{op} is the scanned code's own operator (it registers namespace "
                                     f"`{namespace}`): give it an MPS kernel, or run it on the CPU; not PyTorch's")
    whose, url = OWNERS.get(namespace, (None, None))
    if whose:
        return Upstream("custom-op", f"{op} is {whose} operator, not PyTorch's: report it there", (url,))
    return Upstream("custom-op", f"{op} is not one of PyTorch's operators: the library that registers namespace "
                                 f"`{namespace}` owns it, so report it there, not to PyTorch")
