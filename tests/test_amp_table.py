"""The AutocastMPS table (opscan/knowledge/autocast_mps.txt, tools/build_autocast_mps.py) against the installed
torch, with no network and no wheel: the installed release's rows are the live policy.

The live policy: FakeTensors can be made on device "mps" on any machine, and dispatching them under
`torch.autocast("mps")` runs the installed torch's AutocastMPS kernels; a TorchDispatchMode inside the fake mode
sees what arrives below the autocast kernel, so the dtype an op receives shows its policy (research/cxx's
autocast_live.py: lower_precision_fp -> float32 inputs arrive as float16; fp32 -> float16 inputs arrive as
float32; promote -> a float16 and a float32 input arrive as float32; no rule -> float16 stays float16). Which ops
have an AutocastMPS kernel at all is asked of the dispatcher. The tool's readers of the Python side
(torch/amp/autocast_mode.py, grad_scaler.py, the header) are run on the installed torch's own files.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch._C import DispatchKey

from opscan.knowledge.autocast import TABLE_PATH, format_autocast_table, load_table, parse_autocast_table, policy_of

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import build_autocast_mps  # noqa: E402

INSTALLED = torch.__version__.split("+")[0]
F16, F32 = torch.float16, torch.float32


_MAKING = [False]  # True while a case makes an input (its factory's calls are not what the op receives)


def _cases(dtype):
    """(op as the table spells it, a thunk calling it) with inputs of `dtype` on fake mps."""
    def t(*shape, dt=None):
        _MAKING[0] = True
        try:
            return torch.randn(*shape, device="mps", dtype=dt or dtype)
        finally:
            _MAKING[0] = False

    yield "conv1d", lambda: F.conv1d(t(1, 3, 8), t(4, 3, 3))
    yield "conv2d", lambda: F.conv2d(t(1, 3, 8, 8), t(4, 3, 3, 3))
    yield "conv3d", lambda: F.conv3d(t(1, 3, 4, 4, 4), t(4, 3, 3, 3, 3))
    yield "conv_transpose2d.input", lambda: F.conv_transpose2d(t(1, 3, 4, 4), t(3, 4, 3, 3))
    yield "conv_transpose3d.input", lambda: F.conv_transpose3d(t(1, 3, 4, 4, 4), t(3, 4, 3, 3, 3))
    yield "linear", lambda: F.linear(t(2, 8), t(4, 8))
    yield "matmul", lambda: torch.matmul(t(2, 8), t(8, 4))
    yield "mm", lambda: torch.mm(t(2, 8), t(8, 4))
    yield "bmm", lambda: torch.bmm(t(2, 2, 8), t(2, 8, 4))
    yield "baddbmm", lambda: torch.baddbmm(t(2, 2, 4), t(2, 2, 8), t(2, 8, 4))
    yield "exp", lambda: torch.exp(t(4))
    yield "log", lambda: torch.log(t(4))
    yield "pow.Tensor_Scalar", lambda: torch.pow(t(4), 2)
    yield "softmax.int", lambda: torch.softmax(t(2, 4), 1)
    yield "log_softmax.int", lambda: torch.log_softmax(t(2, 4), 1)
    yield "layer_norm", lambda: F.layer_norm(t(2, 8), [8])
    yield "group_norm", lambda: F.group_norm(t(2, 4, 3), 2)
    yield "mse_loss", lambda: F.mse_loss(t(4), t(4))
    yield "binary_cross_entropy_with_logits", lambda: F.binary_cross_entropy_with_logits(t(4), t(4))
    yield "sum", lambda: torch.sum(t(4))
    yield "cumsum", lambda: torch.cumsum(t(4), 0)
    yield "addcmul", lambda: torch.addcmul(t(4), t(4), t(4, dt=F32))
    yield "atan2", lambda: torch.atan2(t(4), t(4, dt=F32))
    yield "relu", lambda: torch.relu(t(4))
    yield "gelu", lambda: F.gelu(t(4))
    yield "tanh", lambda: torch.tanh(t(4))


def _arrived(thunk) -> set:
    """The floating dtypes of the tensors the ops below the autocast kernel received (`_to_copy`, the casts, and
    the calls that make the inputs excluded)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set = set()

    class Arrivals(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "aten" and func is not torch.ops.aten._to_copy.default and not _MAKING[0]:
                seen.update(a.dtype for a in torch.utils._pytree.tree_leaves((args, kwargs))
                            if isinstance(a, torch.Tensor) and a.is_floating_point())
            return func(*args, **(kwargs or {}))

    with torch.autocast("mps", dtype=F16), Arrivals():
        try:
            thunk()
        except Exception:  # noqa: BLE001 - a fake MPS op may fail after the autocast kernel cast (judged by arrivals)
            pass
    return seen


def live_disagreements(policy) -> list[str]:
    """The cases whose arrivals under the installed torch's AutocastMPS kernels contradict `policy` (a table group's
    AutocastPolicy): [] when the table's rows are the live policy."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    out = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        for dtype in (F32, F16):
            for op, thunk in _cases(dtype):
                rule = policy.cast(op)
                if (rule == "lower_precision_fp") != (dtype == F32):
                    continue  # a lower_precision_fp op is seen casting float32 down; every other from float16
                expected = {F16} if rule == "lower_precision_fp" else {F32} if rule else {F16}
                got = _arrived(thunk)
                if got and got != expected:
                    out.append(f"{op}: table {rule or 'no rule'}, {dtype} in, {sorted(map(str, got))} arrived")
    return out


def test_the_installed_release_is_in_the_table():
    assert policy_of(INSTALLED) is not None, INSTALLED


def test_the_table_lists_exactly_the_installed_AutocastMPS_registrations():
    policy = policy_of(INSTALLED)
    names = torch._C._dispatch_get_all_op_names()
    live = {n.removeprefix("aten::") for n in names
            if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, DispatchKey.AutocastMPS)}
    assert live == set(policy.group.ops)
    assert len(live) == 95  # 26 lower_precision_fp, 59 fp32, 10 promote (2.13.0..2.14.1)


def test_the_installed_release_casts_as_its_rows_say_on_fake_mps_tensors():
    assert live_disagreements(policy_of(INSTALLED)) == []


@pytest.mark.parametrize("op, mutated", [
    ("conv_transpose3d.input", None),  # the 2.9 rule of its own removed: it would run on what it gets
    ("exp", "lower_precision_fp"),  # a policy changed
    ("relu", "fp32"),  # a rule added to an op MPS leaves alone
])
def test_a_mutated_row_fails_the_live_check(op, mutated):
    policy = policy_of(INSTALLED)
    ops = {k: v for k, v in policy.group.ops.items() if k != op}
    if mutated:
        ops[op] = mutated
    broken = replace(policy, group=replace(policy.group, ops=ops))
    found = live_disagreements(broken)
    assert [line.split(":")[0] for line in found] == [op], found


def test_the_tool_reads_the_installed_python_side_as_the_table_says():
    root = os.path.dirname(torch.__file__)
    with open(os.path.join(root, "amp", "autocast_mode.py"), encoding="utf-8") as fh:
        source = fh.read()
    with open(os.path.join(root, "include", "ATen", "autocast_mode.h"), encoding="utf-8") as fh:
        header = fh.read()
    with open(os.path.join(root, "amp", "grad_scaler.py"), encoding="utf-8") as fh:
        scaler = fh.read()
    fields = policy_of(INSTALLED).group.fields
    gate = build_autocast_mps.python_gate(source, header)
    assert gate == {k: fields[k] for k in gate}
    assert build_autocast_mps.scaler_path(scaler) == fields["gradscaler"]
    assert build_autocast_mps.cast_policies(header)[:2] == ["lower_precision_fp", "fp32"]


def test_the_table_reads_back_to_its_own_text():
    with open(TABLE_PATH, encoding="utf-8") as fh:
        text = fh.read()
    assert format_autocast_table(parse_autocast_table(text)) == text
    releases = [r for group in load_table() for r in group.releases]
    from opscan.knowledge import kb_releases

    assert tuple(releases) == kb_releases()


@pytest.mark.parametrize("release, dtype, macos, gate", [
    ("2.4.1", None, (14, 0), "raises RuntimeError: User specified an unsupported autocast device_type 'mps'"),
    ("2.0.0", "float16", (14, 0), "raises RuntimeError: User specified autocast device_type must be 'cuda' or 'cpu'"),
    ("2.5.0", None, (14, 0), "enabled float16"),
    ("2.5.0", "bfloat16", (14, 0), "disabled accepts only float16"),
    ("2.6.0", "bfloat16", (13, 0), "disabled disables bfloat16 MPS autocast below macOS 14"),
    ("2.6.0", "bfloat16", (14, 0), "enabled bfloat16"),
    ("2.11.0", "bfloat16", (13, 0), "enabled bfloat16"),  # the macOS test sits in the unsupported-dtype branch
    ("2.14.1", "float32", (14, 0), "disabled accepts only bfloat16 and float16"),
])
def test_the_gates_per_release(release, dtype, macos, gate):
    assert policy_of(release).gate(dtype, macos).startswith(gate)


def test_the_per_op_lists_change_where_the_wheels_say():
    assert policy_of("2.8.0").cast("conv_transpose3d.input") is None
    assert policy_of("2.9.0").cast("conv_transpose3d.input") == "fp32"
    assert policy_of("2.9.0").cast("conv3d") == "lower_precision_fp"
    assert policy_of("2.5.1").cast("scaled_dot_product_attention") is None
    assert policy_of("2.6.0").cast("scaled_dot_product_attention") == "lower_precision_fp"
    assert policy_of("2.12.1").cast("softmax.Dimname") == "fp32" and policy_of("2.13.0").cast("softmax.Dimname") is None
    assert not any(op.startswith(("fft_", "_fft")) for group in load_table() for op in group.ops)
    assert [policy_of(r).gradscaler for r in ("2.2.2", "2.3.0", "2.7.1", "2.8.0")] == \
        ["absent", "double", "double", "mps-branch"]
