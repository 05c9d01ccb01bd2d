"""Measured mode, in-process and fast: argument specs, the wire protocol, every row of the contract's
decision table, PyTorch's texts, and the reference comparison with its declared tolerances."""

from __future__ import annotations

import math

import pytest
import torch

from opscan.probe import comparison
from opscan.probe.calls import make
from opscan.probe.decide import decide
from opscan.probe.protocol import STATUSES, Comparison, PassOutcome, ProbeCall, ProtocolError, TensorSpec, dumps, loads
from opscan.probe.texts import FALLBACK_WARNING, NOT_IMPLEMENTED, fallback_ops, is_dtype_error
from opscan.trace import TraceOptions
from opscan.trace.argspec import encode, tensor_count, unsupported
from opscan.verdict import Verdict

from helpers_trace import run_trace
from simulated_mps import FLOAT64_TEXT, fallback_warning_text, not_implemented_text


@pytest.fixture(autouse=True)
def _warn_always_restored():
    """The worker turns torch's warn-always on for its process (worker.run_one); run here, in pytest's process, it
    must not leak into later tests (test_accept_placement checks that its recorder restores the setting)."""
    previous = torch.is_warn_always_enabled()
    yield
    torch.set_warn_always(previous)


def test_argspec_encodes_every_kind_of_argument():
    x, idx = torch.randn(2, 3), torch.tensor([0, 2])
    spec = encode((x, [None, idx], 3, 2.5, float("inf"), 1 + 2j, True, "mean"),
                  {"dtype": torch.float16, "device": torch.device("cpu"), "memory_format": torch.channels_last,
                   "layout": torch.strided, "generator": torch.Generator(), "group": object()})
    assert spec["args"] == [{"t": 0}, [None, {"t": 1, "v": [0, 2]}], 3, 2.5, {"float": "inf"},
                            {"complex": [1.0, 2.0]}, True, "mean"]
    assert spec["kwargs"] == {"dtype": {"dtype": "float16"}, "device": {"device": "cpu"},
                              "memory_format": {"memory_format": "channels_last"}, "layout": {"layout": "strided"},
                              "generator": {"generator": "cpu"}, "group": {"unsupported": "object"}}
    assert tensor_count(spec) == 2 and unsupported(spec) == ["object"]


def test_argspec_keeps_no_values_over_the_cap_or_without_data():
    spec = encode((torch.zeros(10, dtype=torch.long), torch.zeros(3, dtype=torch.long, device="meta"),
                   torch.ones(2)), {}, value_cap=5)
    assert spec["args"] == [{"t": 0}, {"t": 1}, {"t": 2}]  # too many values, meta, floating
    from torch._subclasses.fake_tensor import FakeTensorMode

    constant = torch.tensor([3, 7])
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:  # a real constant is read outside the fake mode
        assert encode((constant,), {})["args"] == [{"t": 0, "v": [3, 7]}]
        assert encode((mode.from_tensor(constant),), {})["args"] == [{"t": 0}]  # a fake tensor has no values


class Mixed(torch.nn.Module):
    """Embedding, a TensorList (cat), optional-tensor indexing and a loss with integer targets."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        h = self.embed(ids)
        h = torch.cat([h, h * 2], dim=-1)[:, torch.tensor([0, 2])]
        return torch.nn.functional.cross_entropy(h.reshape(-1, 8), ids[:, :2].reshape(-1) % 8)


def test_every_recorded_call_has_a_spec_matching_its_inputs():
    trace = run_trace(Mixed(), torch.tensor([[1, 2, 3], [4, 5, 6]]))
    work = [c for c in trace.calls if not c.bookkeeping]  # profiler ranges hold a ScriptObject: never probed
    assert all(tensor_count(c.args_spec) == len(c.inputs) and not unsupported(c.args_spec) for c in work)
    index = next(c for c in trace.calls if c.op.display == "aten::index.Tensor")
    assert index.args_spec["args"][1] == [None, {"t": 1, "v": [0, 2]}]  # Tensor?[] with a hole


class TryHalf(torch.nn.Module):
    """Tries zeta in float16 (no CPU kernel) and falls back to float32 when it raises."""

    def forward(self, x):
        q = x.abs() + 2
        try:
            return torch.special.zeta(q, torch.full_like(q, 3.0)).sum()
        except NotImplementedError:
            return torch.special.zeta(q.float(), torch.full_like(q, 3.0).float()).sum()


def test_a_call_that_raised_and_was_caught_stays_in_the_trace():
    trace = run_trace(TryHalf(), torch.randn(3, dtype=torch.float16), TraceOptions(inference=True))
    zetas = [c for c in trace.calls if c.op.name == "special_zeta"]
    assert [c.dtypes for c in zetas] == [("float16", "float16"), ("float32", "float32")]
    assert "not implemented for 'Half'" in zetas[0].raised and zetas[1].raised is None
    assert None not in trace.calls


OUTCOME = PassOutcome("abc", "on", "ran", "TypeError", "msg", ("warned",), True,
                      Comparison("elementwise", False, 1.5, 0.25, "float64", "3 of 4 values"), "SIGSEGV (signal 11)",
                      -11, 0.5, "pooled run: crash", {"fallback_ops": ["aten::abs"]})


@pytest.mark.parametrize("status", STATUSES)
def test_pass_outcome_round_trips_through_one_json_line(status):
    outcome = PassOutcome(**{**OUTCOME.__dict__, "status": status})
    line = dumps(outcome.to_dict())
    assert "\n" not in line and PassOutcome.from_dict(loads(line)) == outcome


def test_other_protocol_versions_and_garbage_are_refused():
    with pytest.raises(ProtocolError):
        PassOutcome.from_dict({**OUTCOME.to_dict(), "v": 2})
    with pytest.raises(ProtocolError):
        loads("Segmentation fault")


def test_probe_call_round_trips_and_its_id_ignores_recorded_values():
    tensors = [TensorSpec("float32", (2, 3), (3, 1)), TensorSpec("int64", (2,), (1,), [0, 1])]
    call = make("aten::index_select", tensors, {"args": [{"t": 0}, 0, {"t": 1}], "kwargs": {}})
    assert ProbeCall.from_dict(loads(dumps(call.to_dict()))) == call
    other = make("aten::index_select", [tensors[0], TensorSpec("int64", (2,), (1,), [1, 1])], call.spec)
    assert other.id == call.id and other.seed == call.seed


def _ran(pass_name="off", within=True, fallback=False, op="aten::grid_sampler_3d"):
    warnings = (fallback_warning_text(op),) if fallback else ()
    return PassOutcome("p", pass_name, "ran", warnings=warnings, fallback_seen=fallback,
                       comparison=Comparison("elementwise", within, 0.0 if within else 2.0, 0.0, "float64",
                                             None if within else "1 of 4 values beyond float32 tolerance"),
                       extra={"fallback_ops": [op] if fallback else []})


def _raised(message, pass_name="off", exc="NotImplementedError"):
    return PassOutcome("p", pass_name, "raised", exc, message)


NI = not_implemented_text("aten::grid_sampler_3d")
DECISION_TABLE = {  # name: (off pass, on pass, verdict, words the evidence must contain)
    "ran, no fallback, within": (_ran(), None, Verdict.NATIVE, "agrees"),
    "ran, no fallback, beyond": (_ran(within=False), None, Verdict.MISMATCH, "beyond"),
    "ran, fallback seen, within": (_ran(fallback=True), None, Verdict.CPU_FALLBACK, "aten::grid_sampler_3d"),
    "ran, fallback seen, beyond": (_ran(within=False, fallback=True), None, Verdict.MISMATCH, "CPU fallback"),
    "NotImplementedError 2.6+, on ran": (_raised(NI), _ran("on", fallback=True), Verdict.UNSUPPORTED, "141287"),
    "NotImplementedError 2.0-2.5, on ran": (_raised(not_implemented_text("aten::grid_sampler_3d", "2.0-2.5")),
                                            _ran("on", fallback=True), Verdict.UNSUPPORTED, "77764"),
    "NotImplementedError, on beyond": (_raised(NI), _ran("on", within=False, fallback=True), Verdict.MISMATCH, "on"),
    "NotImplementedError, on raised": (_raised(NI), _raised("Trying to convert ComplexFloat to the MPS backend",
                                                            "on", "TypeError"), Verdict.ERROR, "ComplexFloat"),
    "dtype error, MPS float64": (_raised(FLOAT64_TEXT, exc="TypeError"), None, Verdict.UNSUPPORTED_DTYPE, "float64"),
    "dtype error, CPU kernel": (_raised('"zeta_cpu" not implemented for \'Half\''), None, Verdict.UNSUPPORTED_DTYPE,
                                "Half"),
    "other exception": (_raised("Adaptive pool MPS: input sizes must be divisible", exc="RuntimeError"),
                        _raised("Adaptive pool MPS: input sizes must be divisible", "on", "RuntimeError"),
                        Verdict.ERROR, "Adaptive pool"),
    "distributed op never falls back": (_raised("The distributed operator 'c10d::allreduce_' is not currently "
                                                "implemented for the MPS device."), None, Verdict.ERROR, "c10d"),
    "signal, off pass": (PassOutcome("p", "off", "crash", signal="SIGSEGV (signal 11)"), None, Verdict.CRASH,
                         "SIGSEGV"),
    "signal, on pass": (_raised(NI), PassOutcome("p", "on", "crash", signal="SIGABRT (signal 6)"), Verdict.CRASH,
                        "on pass"),
    "limit hit": (PassOutcome("p", "off", "timeout", message="no answer within 3 s"), None, Verdict.TIMEOUT, "3 s"),
    "inputs not built": (PassOutcome("p", "off", "unbuildable", "BuildError", "no values recorded"), None,
                         Verdict.UNKNOWN, "no values recorded"),
}


@pytest.mark.parametrize("row", list(DECISION_TABLE))
def test_decision_table(row):
    off, on, verdict, words = DECISION_TABLE[row]
    decision = decide(off, on)
    assert decision.verdict == verdict and words in decision.text, decision


def test_every_verdict_the_table_can_give_is_reached():
    reached = {decide(off, on).verdict for off, on, _, _ in DECISION_TABLE.values()}
    assert reached == set(Verdict)


def test_pytorch_texts_are_recognised():
    assert fallback_ops(["unrelated", fallback_warning_text("aten::take")]) == ["aten::take"]
    assert FALLBACK_WARNING.search(fallback_warning_text("torchvision::nms"))
    assert NOT_IMPLEMENTED.search(not_implemented_text("aten::x", "2.0-2.5")).group("op") == "aten::x"
    assert not NOT_IMPLEMENTED.search("Could not run 'aten::linear_backward' with arguments from the 'CPU' backend")
    assert is_dtype_error(FLOAT64_TEXT) and is_dtype_error("linalg.inv: Low precision dtypes not supported. Got Half")
    assert not is_dtype_error("Adaptive pool MPS: input sizes must be divisible by output sizes")


ADD = torch.ops.aten.add.Tensor


def test_tolerances_are_declared_per_dtype_and_the_least_precise_wins():
    assert comparison.tolerance_for({"float32", "bfloat16", "int64"}) == ("bfloat16",
                                                                          *comparison.TOLERANCES["bfloat16"])
    assert comparison.tolerance_for({"int64"}) is None
    ref = torch.ones(4, dtype=torch.float64)  # float32: limit 1e-5 * 1 + 1e-5 * 1 = 2e-5
    assert Comparison.of_outputs(ADD, [(ref + 1e-5).float()], [ref], ["float32"], "float64").within
    beyond = Comparison.of_outputs(ADD, [(ref + 3e-5).float()], [ref], ["float32"], "float64")
    assert not beyond.within and math.isclose(beyond.max_abs, 3e-5, rel_tol=0.01) and "float32" in beyond.detail


def test_nan_inf_and_integers_are_compared_exactly():
    ref = torch.tensor([1.0, math.nan, math.inf], dtype=torch.float64)
    assert Comparison.of_outputs(ADD, [ref.float()], [ref], ["float32"], "float64").within
    assert "NaN" in Comparison.of_outputs(ADD, [torch.tensor([math.nan, 1.0, math.inf])], [ref], ["float32"],
                                          "x").detail
    ints = torch.tensor([1, 2])
    assert not Comparison.of_outputs(ADD, [ints + 1], [ints], ["int64"], "float64").within


def test_random_empty_and_tie_breaking_outputs_are_compared_by_properties():
    bern = torch.ops.aten.bernoulli.p
    result = Comparison.of_outputs(bern, [torch.tensor([0.0, 1.0])], [torch.tensor([1.0, 0.0])], ["float32"], "float64")
    assert result.within and result.how == "properties"
    pool = torch.ops.aten.max_pool2d_with_indices.default
    out = torch.ones(1, 1, 1, 1)
    result = Comparison.of_outputs(pool, [out, torch.tensor([[[[3]]]])], [out.double(), torch.tensor([[[[0]]]])],
                             ["float32"], "float64")
    assert result.within and result.how == "mixed"  # values elementwise, indices by properties
    empty = torch.ops.aten.empty_like.default  # undefined content: shape and dtype only (the test below)
    assert Comparison.of_outputs(empty, [torch.full((2,), 7.0)], [torch.zeros(2)], ["float32"], "float64").within
    assert not Comparison.of_outputs(empty, [torch.zeros(3)], [torch.zeros(2)], ["float32"], "float64").within


UNCHECKED = {  # name: (comparison of the pass that ran, words the evidence must contain)
    "no CPU reference": (Comparison("none", None, reference="none", detail="no CPU reference: RuntimeError: x"),
                         "NOT checked (no CPU reference: RuntimeError: x)"),
    "no output": (Comparison("none", None, reference="float64", detail="the call has no output to compare"),
                  "NOT checked (the call has no output to compare)"),
    # a journal or bundle results file written before `within: null`: "none" compared nothing whatever it says
    "older record": (Comparison("none", True, reference="none", detail="no CPU reference: RuntimeError: x"),
                     "NOT checked (no CPU reference"),
    "no comparison at all": (None, "NOT checked (no comparison was recorded)"),
}


@pytest.mark.parametrize("case", list(UNCHECKED))
def test_a_pass_that_compared_nothing_is_unchecked_never_within_tolerance(case):
    comparison, words = UNCHECKED[case]
    decision = decide(PassOutcome("p", "off", "ran", comparison=comparison), None)
    assert decision.verdict == Verdict.NATIVE and decision.rule == "probe-native-unchecked"
    assert words in decision.text and "agrees" not in decision.text
    fallback = decide(PassOutcome("p", "on", "ran", comparison=comparison, fallback_seen=True), None)
    assert "NOT checked" in fallback.text and "agrees" not in fallback.text  # cpu_fallback says it too
    unsupported = decide(_raised(NI), PassOutcome("p", "on", "ran", comparison=comparison, fallback_seen=True))
    assert unsupported.verdict == Verdict.UNSUPPORTED and "NOT checked" in unsupported.text
    assert PassOutcome("p", "off", "ran", comparison=comparison).clean  # nothing to re-run alone


def test_the_worker_records_a_missing_reference_as_unchecked(monkeypatch):
    """A call whose CPU reference raises (both float64 and same-dtype): the worker compares nothing and says so."""
    from opscan.probe import backends, worker

    monkeypatch.setattr(worker, "_reference", lambda call, func, tensors, feed=None: "RuntimeError: no CPU kernel")
    call = make("aten::add.Tensor", [TensorSpec("float32", (3,), (1,)), TensorSpec("float32", (3,), (1,))],
                {"args": [{"t": 0}, {"t": 1}], "kwargs": {}})
    outcome = worker.run_one(call, "off", backends.Backend())
    assert outcome.status == "ran" and outcome.comparison.within is None and not outcome.comparison.checked
    assert outcome.comparison.detail == "no CPU reference: RuntimeError: no CPU kernel"
    assert decide(outcome, None).rule == "probe-native-unchecked"


def test_outputs_of_undefined_content_are_compared_by_shape_and_dtype_only():
    # uninitialised memory can hold anything: all NaN, or negative "indices" — neither is a finding
    empty = torch.ops.aten.empty.memory_format
    nan = Comparison.of_outputs(empty, [torch.full((4,), math.nan)], [torch.zeros(4)], ["float32"], "same-dtype")
    assert nan.within is True and nan.how == "shape" and nan.checked
    ints = Comparison.of_outputs(empty, [torch.full((4,), -7)], [torch.zeros(4, dtype=torch.long)], ["int64"], "x")
    assert ints.within is True and ints.how == "shape"
    assert "shape [3] vs reference [4]" in Comparison.of_outputs(empty, [torch.zeros(3)], [torch.zeros(4)], [],
                                                                 "x").detail
    half = Comparison.of_outputs(empty, [torch.zeros(4, dtype=torch.float16)], [torch.zeros(4)], [], "x")
    assert not half.within and "dtype torch.float16 vs reference torch.float32" in half.detail
    resize = torch.ops.aten.resize_.default
    assert Comparison.of_outputs(resize, [torch.full((2, 2), math.nan)], [torch.ones(2, 2)], ["float32"], "x").within
    text = decide(PassOutcome("p", "off", "ran", comparison=nan), None).text
    assert "undefined values" in text and "values not compared" in text
    # their reference keeps the probe's dtypes (a widened empty_like would be float64)
    assert comparison.references(torch.ops.aten.empty_like.default)[0] == (False, "same-dtype")
    assert comparison.references(ADD)[0] == (True, "float64")


def test_every_op_of_undefined_content_in_this_torch_is_covered():
    """Every aten schema whose name says empty, resize or set (torch 2.14.1: 23 names) is compared by shape and
    dtype — except _copy_from_and_resize, which copies its source into the resized tensor (defined values)."""
    import re

    names = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::") and re.search(r"empty|resize|^aten::set_?$", s.name)}
    defined = {"_copy_from_and_resize"}
    covered = {n for n in names if n in comparison.UNDEFINED_CONTENT or n.startswith(comparison.UNDEFINED_PREFIXES)}
    assert names - defined == covered and len(covered) >= 20
    assert comparison.UNDEFINED_CONTENT <= names  # no name made up


def test_measured_empty_call_on_cpu_is_native_whatever_its_memory_held():
    """aten::empty.memory_format run by the real worker on the CPU: compared by shape and dtype, native."""
    from opscan.probe import backends, worker

    call = make("aten::empty.memory_format", [], {"args": [[64, 64]], "kwargs": {"dtype": {"dtype": "float32"}}})
    for _ in range(5):  # uninitialised memory differs between calls; the verdict may not
        outcome = worker.run_one(call, "off", backends.Backend())
        assert outcome.comparison.how == "shape" and outcome.comparison.within is True, outcome
        assert outcome.comparison.reference == "same-dtype"
        assert decide(outcome, None).rule == "probe-native"
