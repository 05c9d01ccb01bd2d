"""The recorder makes each OpCall without the frozen dataclass's __init__ (trace/records.py `recorded_call`, one
`__dict__` per call): the object must be the dataclass's own in every respect, field for field, and a field added to
OpCall must not be silently left out of it."""

from __future__ import annotations

import dataclasses

import torch

from opscan.opkey import OpKey
from opscan.trace.records import CallSite, OpCall, TensorMeta, recorded_call


def _values() -> dict:
    meta = TensorMeta("float32", (2, 3), (3, 1), "cpu", 7, 24, 0, True, False, "strided", (1,))
    return {
        "index": 4, "op": OpKey("aten", "addmm"), "phase": "forward", "module": "fc", "inputs": (meta, meta),
        "outputs": (meta,), "bookkeeping": True, "fx_node": "fc", "module_source": "autograd", "node": 12,
        "parent": 3, "expanded": True, "attrs": ("<tensor>", 1), "args_spec": {"args": [{"t": 0}, 1], "kwargs": {}},
        "raised": "RuntimeError: no", "py": ("torch/nn/functional.py:linear",), "caller": ("model.py", 9),
        "where": CallSite("model.py", 9, "Net.forward"),
    }


def test_a_recorded_call_is_the_dataclass_field_for_field():
    values = _values()
    assert [f.name for f in dataclasses.fields(OpCall)] == list(values)  # every field given, in order
    made, reference = recorded_call(*values.values()), OpCall(**values)
    assert made == reference and repr(made) == repr(reference)
    for field in dataclasses.fields(OpCall):
        assert getattr(made, field.name) is values[field.name]
    assert dataclasses.asdict(made) == dataclasses.asdict(reference)
    assert dataclasses.replace(made, index=5) == dataclasses.replace(reference, index=5)


def test_a_recorded_call_stays_frozen():
    made = recorded_call(*_values().values())
    try:
        made.index = 9
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a recorded call must be as frozen as the dataclass")


def test_every_call_of_a_real_trace_round_trips_through_the_dataclass():
    from opscan.trace import trace_step
    from opscan.target.load import Target

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    target = Target("inline", "inline", model, (torch.randn(2, 4),), None, None, None)
    calls = trace_step(target).calls
    assert calls
    for call in calls:
        assert OpCall(**{f.name: getattr(call, f.name) for f in dataclasses.fields(OpCall)}) == call


class _Overwrites(torch.nn.Module):
    """Integer tensors written without being read: an `empty` that copy_ fills, an out= of add."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        idx = torch.empty(3, dtype=torch.int64, device=x.device).copy_(torch.arange(3, device=x.device))
        out = torch.empty(3, dtype=torch.int64, device=x.device)
        torch.add(idx, 1, out=out)
        return self.lin(x)[out].sum()


def test_argspec_keeps_no_values_of_what_a_call_overwrites_without_reading():
    # their values are whatever memory the tensor was given: recorded, they made args_spec (and the probes planned
    # from it) differ run to run (found in BERT's, the LSTM's and Faster R-CNN's traces)
    from opscan.target.load import Target
    from opscan.trace import trace_step

    calls = trace_step(Target("t", "t", _Overwrites(), torch.randn(4, 4), None, None, None)).calls
    copy = next(c for c in calls if c.op.name == "copy_" and c.inputs[0].dtype == "int64")
    dst, src = copy.args_spec["args"][:2]
    assert "v" not in dst and src["v"] == [0, 1, 2]
    add = next(c for c in calls if c.op.name == "add" and c.op.overload == "out")
    assert "v" not in add.args_spec["kwargs"]["out"] and add.args_spec["args"][0]["v"] == [0, 1, 2]
