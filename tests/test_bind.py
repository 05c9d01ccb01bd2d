"""One binder for every condition (opscan/predict/bind.py), its names from each release's schemas
(opscan/knowledge/signatures.txt): no knowledge file keeps argument names by hand, every name a condition reads is
one its ops' schemas give in every release the condition covers, and the binder binds a lens call's keyword
arguments by name and an argument left out to the schema's default."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from opscan.knowledge import load_knowledge
from opscan.knowledge.conditions import TensorArg, names_read
from opscan.knowledge.kernel_rules import load_kernel_rules
from opscan.knowledge.signatures import NO_DEFAULT, RECORDED_AS, Argument, load_signatures, names_for
from opscan.knowledge.yaml_index import schema_arguments
from opscan.mps_view import MpsCall
from opscan.opkey import OpKey
from opscan.predict.bind import arguments
from opscan.predict.calls import predict_call
from opscan.trace.records import TensorMeta

from conftest import REPO

TABLE = load_signatures()


def _bound_names(op: str, release: str) -> frozenset[str] | None:
    return names_for(op, release)


def test_a_schema_s_arguments_are_read_with_their_defaults():
    assert schema_arguments("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor") == (
        ("self", None), ("other", None), ("alpha", "1"))
    assert schema_arguments('f(Tensor(a!) self, int[2] k=[0,0], str s="a,b", *, Tensor(a!) out) -> Tensor') == (
        ("self", None), ("k", "[0,0]"), ("s", '"a,b"'), ("out", None))
    assert [Argument("r", "Mean").value(), Argument("p", "None").value(), Argument("k", "[0,0]").value()] == \
        [1, None, (0, 0)]  # a list default reads as the condition language's lists do: a tuple
    assert Argument("m", "contiguous_format").value() is NO_DEFAULT and Argument("x").value() is NO_DEFAULT


def test_the_table_holds_the_installed_release_s_schemas():
    sys.path.insert(0, str(REPO / "tools"))
    spec = importlib.util.spec_from_file_location("build_signatures", REPO / "tools" / "build_signatures.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--installed", "--check"]) == 0
    assert [str(a) for a in TABLE.arguments("scaled_dot_product_attention", "2.0.0")][-1] == "is_causal=False"
    assert str(TABLE.arguments("scaled_dot_product_attention", "2.14.1")[-1]) == "enable_gqa=False"  # from 2.5.0
    assert [a.name for a in TABLE.arguments("linalg_matrix_exp.out", "2.14.1")] == ["self", "out"]  # autogen


@pytest.mark.parametrize("section", ["rules", "fallbacks"])
def test_every_kernel_condition_reads_names_its_ops_schemas_give(section):
    rules = getattr(load_kernel_rules(), section)
    for rule in rules:
        releases = [r for r in TABLE.releases if section == "rules" or rule.releases.covers(r)]
        for op in rule.ops:
            for release in releases:
                names = _bound_names(op, release)
                assert names is None or names_read(rule.code) <= names, (rule.id, op, release)
            assert _bound_names(op, TABLE.releases[-1]) is not None, (rule.id, op)


def test_every_composite_path_condition_reads_names_its_schema_gives():
    from opscan.knowledge.composite_paths import load_composite_paths

    for entry in load_composite_paths().paths:
        for release in (r for r in TABLE.releases if entry.releases.covers(r)):
            for path in entry.paths:
                if path.code is not None:
                    assert names_read(path.code) <= _bound_names(entry.op, release), (entry.op, release)


def test_recorded_as_is_what_the_lens_and_the_view_record():
    from opscan.trace.lens import BRANCHES

    lens = {b.kernel.yaml_name: b.op for b in BRANCHES}  # the op a "replace" group runs: the call it recorded
    assert {k: v for k, v in RECORDED_AS.items() if k in lens} == lens
    assert {k for k, v in RECORDED_AS.items() if v.startswith("convolution")} == {
        "_mps_convolution", "_mps_convolution_transpose", "mps_convolution_backward",
        "mps_convolution_transpose_backward"}


def _meta(shape, dtype="float32"):
    stride, step = [], 1
    for d in reversed(shape):
        stride.insert(0, step)
        step *= d
    return TensorMeta(dtype, tuple(shape), tuple(stride), "cpu", 1, 0)


def _lstm(spec_args, spec_kwargs):
    metas = tuple((t.dtype, t.shape, t.stride, t.offset, t.requires_grad)
                  for t in (_meta((2, 3, 8)), _meta((1, 2, 4)), _meta((1, 2, 16))))
    return MpsCall(0, OpKey.parse("aten::_lstm_mps"), "forward", "rnn", (_meta((2, 3, 8)),), (),
                   ("float32",), rule="mps-lstm", call=(metas, {"args": spec_args, "kwargs": spec_kwargs}))


def test_a_lens_call_s_keyword_arguments_bind_by_name():
    """nn.LSTM with projections (h of 4 features, c of 16): the kernel check reads hx; given as a keyword after
    another keyword, it was bound by position (the runtime checks' binder appended the keywords' values) and the
    row stayed native."""
    positional = _lstm([{"t": 0}, [{"t": 1}, {"t": 2}], [], True, 1, 0.0, False, False, True], {})
    keyword = _lstm([{"t": 0}], {"batch_first": True, "hx": [{"t": 1}, {"t": 2}], "params": [], "has_biases": True,
                                 "num_layers": 1, "dropout": 0.0, "train": False, "bidirectional": False})
    kb = load_knowledge(release="2.14.1")
    assert arguments(keyword, "2.14.1")["hx"][1].shape == (1, 2, 16)
    for made in (positional, keyword):
        found = predict_call(made, kb, {})
        assert found.evidence.rule == "kernel-lstm-projections", found.evidence


def test_an_argument_left_out_is_its_schema_default():
    """torch.linalg.svd(A) leaves `driver` to its default None: the driver check is decided (it passes), not left
    among the checks the prediction does not model; silent-bug conditions read the same defaults."""
    svd = MpsCall(0, OpKey.parse("aten::_linalg_svd"), "forward", "", (_meta((4, 4)),), (), ("float32",),
                  attrs=("<tensor>", False))
    bound = arguments(svd, "2.14.1")
    assert (bound["full_matrices"], bound["compute_uv"], bound["driver"]) == (False, True, None)
    assert isinstance(bound["A"], TensorArg) and bound["A"].stride == (4, 1)
    found = predict_call(svd, load_knowledge(release="2.14.1"), {})
    assert "driver= is not supported" not in found.evidence.text
    given = MpsCall(0, OpKey.parse("aten::_linalg_svd"), "forward", "", (_meta((4, 4)),), (), ("float32",),
                    attrs=("<tensor>", False, True, "gesvd"))
    assert predict_call(given, load_knowledge(release="2.14.1"), {}).evidence.rule == "kernel-svd-driver"
