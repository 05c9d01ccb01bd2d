"""A hand-built Report for the render and schema tests: no torch, no trace."""

from __future__ import annotations

from opscan.opkey import OpKey
from opscan.graph.lanes import Lane, Reason, ReasonKind
from opscan.report import Report, Row
from opscan.verdict import Evidence, Source, Verdict


def row(op: str, dtypes, verdict: Verdict, modules, *, calls=1, phases=("forward",), text="from the table",
        remedy=None, cpu_op=None, where=(), rule=None, source="test") -> Row:
    """A predicted row with short evidence (`where`: its places, as report/where.py writes them)."""
    return Row(
        op=OpKey.parse(op), dtypes=tuple(dtypes), verdict=verdict, source=Source.PREDICTED,
        evidence=Evidence(rule or f"rule-{verdict.value}", text, source), remedy=remedy, since=None,
        cpu_op=OpKey.parse(cpu_op) if cpu_op else None, phases=tuple(phases), modules=tuple(modules),
        calls=calls, shapes=((2, 3),), where=tuple(where),
    )


def place(line: int, text: str, *, phases=("forward",), calls=1, file="model.py", function="Net.forward",
          cell=None) -> dict:
    """A `where` entry of the user's code, as report/where.py writes it."""
    return {"file": file, "line": line, "function": function, "by": "call", "phases": list(phases), "calls": calls,
            "via": None, "text": text, "cell": cell}


ROWS = (
    row("aten::convolution", ["float32"] * 3, Verdict.NATIVE, ["encoder.conv"], calls=2),
    row("aten::upsample_bicubic2d.out", ["float32"], Verdict.CPU_FALLBACK, ["decoder.up"],
        phases=("forward", "backward"), calls=4, text="always-CPU list", remedy="set the fallback variable",
        where=[place(31, "x = self.up(x)", phases=("forward", "backward"), calls=4, function="Decoder.forward")]),
    row("aten::add.Tensor", ["float64", "float64"], Verdict.UNSUPPORTED_DTYPE, ["encoder.conv", "head"],
        calls=3, text="float64 [no MPS dtype]", remedy="cast to float32",
        where=[place(18, "h = self.conv(x).double() + self.offsets", calls=2, function="Encoder.forward"),
               place(44, "return self.head(h) + self.offsets", calls=1)]),
    row("aten::_foreach_mul_.Scalar", ["float32"], Verdict.UNKNOWN, [""], phases=("optimizer",),
        text="not classified"),
    row("aten::linear", ["float32", "float32"], Verdict.NATIVE, ["head"], cpu_op="aten::addmm"),
)


def report(rows=ROWS, lane=None) -> Report:
    """A small hand-built report: encoder, decoder and head modules, one step."""
    return Report(
        opscan_version="0.1.0", kb_version="kb-test", model="model.py:build_model", model_name="Net",
        mode="predicted",
        assumptions={"torch_release": "2.14.1", "installed_torch": "2.14.1+cpu", "macos": "14.0",
                     "chip": None, "fallback_env": "unset"},
        environment={"python": "3.11.7", "note": "ünïcode ✓"},
        phases={"forward": {"calls": 7, "bookkeeping": 0}, "optimizer": {"calls": 1, "bookkeeping": 2}},
        rows=rows,
        lane=lane or Lane("dual-track", (
            Reason(ReasonKind.ROW, "aten::upsample_bicubic2d.out [float32] is cpu_fallback: always-CPU list", 1),
            Reason(ReasonKind.ROW, "aten::add.Tensor [float64×2] is unsupported_dtype: float64 [no MPS dtype]", 2),
        )),
        trace={"calls": 8, "bookkeeping_calls": 2, "step": "train",
               "fx": {"traced": False, "reason": "TraceError: [proxy] in control flow"}},
        modules=(("", "Net"), ("encoder", "Encoder"), ("encoder.conv", "Conv2d"), ("decoder", "Decoder"),
                 ("decoder.up", "Upsample"), ("head", "Linear")),
    )
