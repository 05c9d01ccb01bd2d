"""Issue 25's five mechanism classes, each on a real model of its kind (tests/targets/mechanisms.py):
complex FFT through the OpInfo map, expectations applied only under their stated condition, the fx
pre-pass leaving the user's objects as they were, sparse layouts never judged as dense, composites
decided when no callee can be native."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from opscan.scan import ScanOptions, scan
from opscan.trace import fxnodes
from opscan.verdict import Verdict

from conftest import TARGETS

MECH = TARGETS / "mechanisms.py"


def _options(name: str, **kw) -> ScanOptions:
    return ScanOptions(f"{MECH}:{name}", **kw)


def _load(name: str):
    spec = importlib.util.spec_from_file_location("mechanisms_under_test", MECH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


def _rows(report):
    return {(r.op.display, tuple(r.dtypes), r.verdict.value) for r in report.rows if r.verdict != Verdict.NATIVE}


# --- 3. the fx pre-pass never touches the user's objects -------------------------------------------


def _state(obj, path="model", seen=None, out=None):
    """Every attribute binding and container item reachable from `obj`, by path: the identity of
    tensors and objects, the value of plain data (an independent walk, not opscan's)."""
    seen = set() if seen is None else seen
    out = {} if out is None else out
    if isinstance(obj, (int, float, str, bool, type(None), torch.dtype, torch.device)):
        out[path] = ("value", obj)
        return out
    out[path] = (type(obj).__name__, id(obj))
    if id(obj) in seen or isinstance(obj, (torch.Tensor, type)) or callable(obj) and not hasattr(obj, "__dict__"):
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    else:
        items = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for key, value in items:
        _state(value, f"{path}.{key}", seen, out)
    return out


@pytest.mark.parametrize("target", ["diffusion", "diffusers_ddpm"])
def test_symbolic_tracing_leaves_the_model_and_its_helpers_as_they_were(target):
    if target == "diffusers_ddpm":
        pytest.importorskip("diffusers")
    model, _ = _load(target)
    before = _state(model)
    rng = torch.get_rng_state()
    gm, info = fxnodes.symbolic(model)
    after = _state(model)
    assert gm is None and "'len' is not supported" in info.reason  # the pre-pass did run into the scheduler
    assert after == before
    assert isinstance(model.scheduler.alphas_cumprod, torch.Tensor)  # not a Proxy
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_successful_trace_leaves_cached_state_alone():
    """A forward that caches on itself and is traceable: the graph is kept, the cache is not a Proxy."""

    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.cache = None
            self.seen = []
            self.extra = {"hits": 0}

        def forward(self, x):
            self.cache = self.linear(x)
            self.seen.append(self.cache)
            self.extra["last"] = self.cache
            return self.cache.relu()

    model = Caching()
    before = _state(model)
    gm, info = fxnodes.symbolic(model)
    assert gm is not None and info.traced
    assert _state(model) == before and model.cache is None and model.seen == [] and model.extra == {"hits": 0}


@pytest.mark.parametrize("target", ["diffusion", "diffusers_ddpm"])
def test_a_model_with_a_scheduler_scans_as_with_no_fx(target):
    if target == "diffusers_ddpm":
        pytest.importorskip("diffusers")
    with_fx = scan(_options(target))
    without = scan(_options(target, fx=False))
    assert not with_fx.trace["fx"]["traced"]
    assert [(r.op, r.dtypes, r.verdict, r.calls) for r in with_fx.rows] == \
        [(r.op, r.dtypes, r.verdict, r.calls) for r in without.rows]
    assert with_fx.lane.name == "mac-first"
