"""What silent-bug conditions read, end to end: the tensor attributes of the condition language against torch's
own, the trace's storage offsets, requires_grad and host placement, probes that keep a view's offset and a CPU
operand on the CPU (also in repro scripts' rebuilder), the element cap lifted for a call meeting a size
condition, and a virtual Mac that never stands for MPS."""

from __future__ import annotations

import os
import random

import torch
from torch._prims_common import suggest_memory_format

from opscan.knowledge.conditions import TensorArg
from opscan.probe.calls import plan
from opscan.probe.protocol import ProbeCall, TensorSpec
from opscan.probe.rebuild import initial, materialize_args
from opscan.probe.backends import virtual_machine
from opscan.probe.stage import measured_on
from opscan.scan import ScanOptions, prepare

TARGETS = os.path.join(os.path.dirname(__file__), "targets", "silent.py")


def _arg(t: torch.Tensor) -> TensorArg:
    return TensorArg(str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(t.stride()), t.storage_offset())


def test_layout_attributes_agree_with_torch():
    rng = random.Random(0)
    cases = [torch.randn(2, 4, 4, 5).contiguous(memory_format=torch.channels_last)[:, :2],
             torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=torch.channels_last_3d), torch.randn(5, 3)[1:],
             torch.randn(4).expand(3, 4), torch.randn(2, 1, 4, 4).contiguous(memory_format=torch.channels_last)]
    for _ in range(200):
        shape = [rng.choice([1, 2, 3]) for _ in range(rng.choice([4, 5]))]
        t = torch.randn(*shape).permute(*rng.sample(range(len(shape)), len(shape)))
        cases.append(t[:, :max(1, t.shape[1] - 1)] if rng.random() < 0.5 else t)
    for t in cases:
        a = _arg(t)
        last = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        assert a.is_contiguous == t.is_contiguous()
        assert a.is_channels_last_contiguous == (t.dim() in (4, 5) and t.is_contiguous(memory_format=last))
        assert a.looks_channels_last == (t.dim() in (4, 5) and suggest_memory_format(t) == last)
        reach = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        assert a.max_elem_offset == reach and a.itemsize == t.element_size()


def _calls(factory):
    return prepare(ScanOptions(f"{TARGETS}:{factory}", memory=False)).trace.calls


def test_the_trace_records_offsets_grad_and_what_stays_on_the_host():
    calls = _calls("denoiser")
    select = next(c for c in calls if c.op.name == "select")
    mul = next(c for c in calls if c.op.name == "mul")
    assert select.inputs[0].host and select.outputs[0].host and select.outputs[0].offset == 3
    assert not mul.inputs[0].host and mul.inputs[1].host and mul.inputs[1].offset == 3
    assert not mul.outputs[0].host  # made from an MPS tensor: on MPS
    addmm = next(c for c in calls if c.op.name == "addmm")
    assert addmm.inputs[0].requires_grad and not addmm.inputs[1].requires_grad
    moved = _calls("on_device")  # a buffer moves with the model
    assert not any(t.host for c in moved if c.phase == "forward" for t in c.inputs)
    steps = [t for c in moved if c.phase == "optimizer" for t in c.inputs if t.host and t.shape == ()]
    assert steps  # AdamW's step counters: torch.tensor(0.0) without device=, CPU tensors on a Mac too
    made = _calls("schedule_in_step")  # torch.linspace without device= inside the step
    assert next(c for c in made if c.op.name == "mul").inputs[1].host


def test_a_given_tensors_offset_counts_from_where_it_starts():
    from torch import nn

    from opscan.target.load import Target
    from opscan.trace import trace_step

    base = torch.randn(10, 8)
    model = nn.Linear(8, 8)
    target = Target("t", "t", model, base[2:6], None, None, None)
    calls = trace_step(target).calls
    first = next(c for c in calls if c.inputs and c.inputs[0].shape == (4, 8))
    assert first.inputs[0].offset == 0  # .to("mps") copies the input to a fresh storage: offset 0 there


def test_probes_keep_offsets_and_host_placement_and_rebuild_them():
    prepared = prepare(ScanOptions(f"{TARGETS}:denoiser", memory=False))
    found = plan(prepared.trace, prepared.view, "mps", 1 << 20)
    mul = next(p for p in found.probes if p.op == "aten::mul.Tensor")
    assert mul.tensors[1] == TensorSpec("float32", (), (), None, 3, True)
    assert ProbeCall.from_dict(mul.to_dict()) == mul
    gen = torch.Generator().manual_seed(1)
    tensors = [initial(t.dtype, t.shape, t.stride, t.values, gen, t.offset)[0] for t in mul.tensors]
    assert tensors[1].storage_offset() == 3
    args, _ = materialize_args(tensors, ["float32", "float32"], mul.spec, 0, "meta", False, hosts={1})
    assert args[0].device.type == "meta" and args[1].device.type == "cpu" and args[1].storage_offset() == 3
    assert torch.equal(args[1], tensors[1])


def test_a_call_meeting_a_size_condition_is_probed_at_its_real_size():
    prepared = prepare(ScanOptions(f"{TARGETS}:long_bmm", memory=False, fake=True, inference=True))
    found = plan(prepared.trace, prepared.view, "mps", 1 << 20)
    bmm = next(p for p in found.probes if p.op == "aten::bmm")
    assert bmm.shrink is None and "silent-bug-197636" in bmm.note and "lifted" in bmm.note
    assert bmm.tensors[0].shape == (65537, 256, 64)
    linear = next(p for p in found.probes if p.op != "aten::bmm" and max(
        t.shape[0] for t in p.tensors if t.shape) == 65537)
    assert linear.shrink or (linear.note or "").startswith("full shapes")  # others stay capped


def test_a_virtual_mac_is_detected_from_sysctl():
    values = {"kern.hv_vmm_present": "1", "hw.model": "VirtualMac2,1", "machdep.cpu.brand_string": "Apple M1 (Virtual)"}
    found = virtual_machine(values.get)
    assert found["detected"] and len(found["signals"]) == 3
    assert virtual_machine({"kern.hv_vmm_present": "0", "hw.model": "Mac14,2"}.get) is None


def test_a_virtual_mac_never_stands_for_mps_and_the_report_says_so():
    vm = {"detected": True, "signals": ["kern.hv_vmm_present=1"]}
    where = measured_on("mps", {"off": {"device": "mps", "virtual_machine": vm}})
    assert not where.stands_for_mps and where.virtual == ("kern.hv_vmm_present=1",)
    simulated = measured_on("mps", {"off": {"device": "mps", "simulated": True, "backend": "sim",
                                            "virtual_machine": vm}})
    assert not simulated.stands_for_mps and "virtual Mac" in simulated.label
    assert measured_on("mps", {"off": {"device": "mps", "virtual_machine": None}}).stands_for_mps


def test_measured_on_a_simulated_virtual_mac_keeps_the_predictions():
    import simulated_mps

    from opscan.probe.stage import ProbeOptions
    from opscan.scan import scan

    vm = {"detected": True, "signals": ["hw.model=VirtualMac2,1"]}
    probe = ProbeOptions(device="mps", workers=1, double=simulated_mps.double({"virtual_machine": vm}))
    report = scan(ScanOptions(f"{TARGETS}:denoiser", torch_version="2.13.0", memory=False, probe=probe))
    assert report.mode == "predicted" and report.measurement["virtual_machine"]["signals"] == vm["signals"]
    assert "VIRTUAL Mac" in report.measurement["note"] and not report.measurement["stands_for_mps"]
    row = next(r for r in report.rows if r.op.display == "aten::mul.Tensor")
    assert row.evidence.rule == "silent-bug-187117" and row.measured["verdict"] == "native"
