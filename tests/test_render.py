"""Render tests: the table at width 100 without colour as exact text, JSON/YAML agreement, and the
FORMATS registry against the CLI's --format choices. Reports are built by hand: no torch, no trace."""

from __future__ import annotations

import json
from dataclasses import replace

import yaml

from opscan.cli.common import FORMAT_NAMES
from opscan.render import FORMATS, render_json, render_table, render_yaml
from opscan.graph.lanes import Lane, Reason, ReasonKind
from opscan.report import Report
from opscan.verdict import Verdict

from helpers_report import ROWS, report


def table(r: Report, **kw) -> str:
    """The table at width 100 without colour, trailing spaces dropped (rich pads cells)."""
    text = render_table(r, width=100, color=False, **kw)
    return "\n".join(line.rstrip() for line in text.splitlines())


def test_table_golden(golden):
    # Rows sort by their first module ('' = the model itself first), the worst verdict first within a module;
    # native rows are hidden without verbose; [proxy] and [no MPS dtype] keep their brackets.
    golden("table-width100.txt", table(report()) + "\n")


def wide(r: Report, **kw) -> list[str]:
    """The table at width 200 (nothing folds), as lines."""
    return table_lines(render_table(r, width=200, color=False, **kw))


def table_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def test_summary_always_shows_unknown():
    native_only = tuple(r for r in ROWS if r.verdict == Verdict.NATIVE)
    lines = wide(report(native_only, Lane("mac-first", (Reason(ReasonKind.ROW, "all 2 rows are native"),))))
    # 2 native rows: convolution (2 calls) + linear (1 call) = 3 calls; unknown shown although 0
    assert "Summary: native 2 ops/3 calls · unknown 0 ops/0 calls" in lines
    assert "All 2 rows are native (-v lists them)." in lines


def test_summary_lists_every_verdict_present():
    summary = next(line for line in wide(report()) if line.startswith("Summary:"))
    assert summary == ("Summary: native 2 ops/3 calls · unknown 1 ops/1 calls · cpu_fallback 1 ops/4 calls · "
                       "unsupported_dtype 1 ops/3 calls")


def table_cells(lines: list[str]) -> list[tuple[str, str, str]]:
    """(module, op, verdict) of each row of the -v table, cut at the header's column starts (nothing folds at
    200); the table ends where the findings begin."""
    at = next(i for i, line in enumerate(lines) if line.startswith("#  module "))
    header = lines[at]
    module, op, dtypes, verdict, calls = (header.index(f" {name} ") + 1
                                          for name in ("module", "op", "dtypes", "verdict", "calls"))
    end = next(i for i, line in enumerate(lines) if i > at and line.startswith(("Findings:", "All ")))
    return [(r[module:op].strip(), r[op:dtypes].strip(), r[verdict:calls].strip()) for r in lines[at + 1:end]]


def test_rows_grouped_by_module_worst_first():
    cells = table_cells(wide(report(), verbose=True))
    # sorted by first module, the model itself ('') first; encoder.conv's two rows adjacent, the worst first
    assert cells == [
        ("(model)", "aten::_foreach_mul_.Scalar", "unknown"),
        ("decoder.up", "aten::upsample_bicubic2d.out", "cpu_fallback"),
        ("encoder.conv (+1)", "aten::add.Tensor", "unsupported_dtype"),
        ("encoder.conv", "aten::convolution", "native"),
        ("head", "aten::linear", "native"),
    ]


def test_native_rows_only_with_verbose():
    quiet, verbose = "\n".join(wide(report())), "\n".join(wide(report(), verbose=True))
    assert "aten::convolution" not in quiet and "aten::convolution" in verbose
    assert "(CPU trace: aten::addmm)" in verbose  # the op the CPU trace saw, when MPS runs another


def test_lane_printed_with_reasons():
    lines = wide(report())
    at = lines.index("Lane (predicted): dual-track")
    # the lane names the deciding rows; their evidence is in "Why, and what to do" above
    end = next(i for i, line in enumerate(lines) if line.startswith("Next:"))
    assert lines[at + 1:end] == [
        "  - aten::upsample_bicubic2d.out [float32] is cpu_fallback",
        "  - aten::add.Tensor [float64×2] is unsupported_dtype",
    ]


def test_each_finding_says_why_and_what_to_do():
    lines = wide(report())
    at = lines.index("Why, and what to do:")
    # one entry per cause (the user's line, the rule), most severe first: the line, its source text as the user
    # wrote it, the ops made there, why, the rule, the fix and where it belongs upstream
    assert lines[at + 1:at + 9] == [
        "[1] model.py:18 in Encoder.forward: unsupported_dtype (predicted)",
        "      h = self.conv(x).double() + self.offsets",
        "    ops: aten::add.Tensor [float64×2] (forward, 2 calls)",
        "    why: float64 [no MPS dtype]",
        "    rule: rule-unsupported_dtype · source: test",
        "    fix: cast to float32",
        "    upstream: worth reporting to PyTorch: --repro drafts an ISSUE.md with a minimal snippet",
        "[2] model.py:44 in Net.forward: unsupported_dtype (predicted)",
    ]
    upsample = lines.index("[3] model.py:31 in Decoder.forward: cpu_fallback (predicted)")
    assert lines[upsample + 2] == "    ops: aten::upsample_bicubic2d.out [float32] (forward, backward, 4 calls)"
    assert lines[upsample + 5] == "    fix: set the fallback variable"
    assert "[4] no line of your code is known: unknown (predicted)" in lines  # no `where`: said, not hidden


def test_lane_lists_ten_reasons_then_counts_the_rest():
    reasons = tuple(Reason(ReasonKind.ROW, f"aten::op{i} [float32] is unknown: reason {i}", i) for i in range(13))
    lines = wide(report(lane=Lane("dual-track", reasons)))
    at = lines.index("Lane (predicted): dual-track")
    assert lines[at + 1] == "  - aten::op0 [float32] is unknown"
    assert lines[at + 10] == "  - aten::op9 [float32] is unknown"
    assert lines[at + 11] == "  … and 3 more rows (see report.json)"  # 13 - 10 = 3


def test_markup_like_text_keeps_its_brackets():
    text = "\n".join(wide(report()))
    assert "[no MPS dtype]" in text and "TraceError: [proxy] in control flow" in text
    assert "[float32]" in text and "[float64×2]" in text


def test_module_tree_worst_verdict_and_row_counts():
    lines = wide(report(), tree=True)
    # rows per module: encoder.conv has convolution and add (2), head has add and linear (2), decoder.up
    # has upsample (1), the model all 5; a module's verdict is the worst of its rows and its children's
    assert "Net unsupported_dtype (5 ops incl. children)" in lines
    assert "├── encoder (Encoder) unsupported_dtype (2 ops incl. children)" in lines
    assert "│   └── up (Upsample) cpu_fallback (1 ops incl. children)" in lines
    assert "└── head (Linear) unsupported_dtype (2 ops incl. children)" in lines


def test_colour_only_when_asked():
    assert "\x1b[" not in render_table(report(), width=100, color=False)
    assert "\x1b[" in render_table(report(), width=100, color=True)


# --- JSON and YAML -----------------------------------------------------------------------------------


def test_json_and_yaml_hold_the_same_dict():
    r = report()
    assert yaml.safe_load(render_yaml(r)) == json.loads(render_json(r)) == r.to_dict()


def test_json_rows_use_contract_spellings():
    rows = json.loads(render_json(report()))["ops"]
    upsample = next(r for r in rows if r["op"] == "aten::upsample_bicubic2d")
    assert upsample["overload"] == "out"
    assert next(r for r in rows if r["op"] == "aten::convolution")["overload"] == "default"
    assert next(r for r in rows if r["op"] == "aten::linear")["cpu_op"] == "aten::addmm"


def test_yaml_keeps_schema_key_order():
    keys = [line.split(":")[0] for line in render_yaml(report()).splitlines() if line and line[0] != " "
            and not line.startswith("-")]
    assert keys[:4] == ["schema_version", "opscan_version", "kb_version", "model"]


# --- the registry ------------------------------------------------------------------------------------


def test_formats_cover_every_cli_choice():
    assert set(FORMATS) == set(FORMAT_NAMES)
    for name in FORMAT_NAMES:
        out = FORMATS[name](report())
        assert isinstance(out, str) and out.endswith("\n"), name


def test_table_shows_the_transfers_per_step_and_the_costliest_calls():
    transfers = {"step": {"bytes": 3432, "syncs": 7, "d2h_bytes": 2800, "h2d_bytes": 632},
                 "fallback": {"bytes": 3432}, "explicit": {"bytes": 0}, "implicit": {"bytes": 0},
                 "ranking": [{"op": "aten::put_", "module": "block.attn", "phase": "backward", "bytes": 1776,
                              "syncs": 4},
                             {"op": "aten::take", "module": "", "phase": "forward", "bytes": 1656, "syncs": 3}]}
    lines = wide(replace(report(), transfers=transfers))
    start = lines.index("CPU<->MPS per step (predicted): 3.4 KB in 7 syncs (to host 2.7 KB, to MPS 632 B; fallback "
                        "3.4 KB)")
    assert lines[start + 1:start + 3] == ["  aten::put_ in block.attn (backward): 1.7 KB, 4 syncs",
                                          "  aten::take in (model) (forward): 1.6 KB, 3 syncs"]


def test_table_has_no_transfer_line_when_nothing_crosses():
    quiet = {"step": {"bytes": 0, "syncs": 0, "d2h_bytes": 0, "h2d_bytes": 0}, "ranking": []}
    assert not any(line.startswith("CPU<->MPS") for line in wide(replace(report(), transfers=quiet)))


def test_table_ends_with_the_next_step():
    predicted = wide(report())
    tail = " ".join(predicted[next(i for i, line in enumerate(predicted) if line.startswith("Next:")):])
    assert tail == ("Next: these verdicts are predicted. On a Mac, `opscan TARGET` measures every call and `opscan "
                    "accept TARGET` runs the real step against the CPU; `opscan bundle TARGET` packs the probes for a "
                    "Mac you reach over SSH. `--repro` writes a standalone script per call and an ISSUE.md for each "
                    "of the 3 findings worth reporting to PyTorch.")
    measured = wide(replace(report(), mode="measured", repro={"findings": []}))
    assert not any(line.startswith(("Next:", "`--repro`")) for line in measured)


def test_rows_measured_elsewhere_that_differ_are_listed_under_the_measurement_line():
    # measured on cpu, a row predicted native for MPS that failed there: no finding about MPS, but said (issue 35:
    # findings are causes on MPS; what the measurement saw elsewhere stays in view)
    from helpers_report import place

    odd = replace(ROWS[0], where=(place(12, "y = self.conv(x)"),),
                  measured={"device": "cpu", "verdict": "error", "rule": "probe-error", "text": "RuntimeError: boom"})
    measurement = {"device": "cpu", "stands_for_mps": False, "probes": 3, "calls": 5, "outcomes": {"ran": 2},
                   "shapes": {"policy": "full"}, "disagreements": [{"row": 0}]}
    lines = wide(replace(report(rows=(odd, *ROWS[1:])), measurement=measurement))
    at = next(i for i, line in enumerate(lines) if line.startswith("Measured on cpu (not MPS"))
    assert lines[at].endswith("1 differ from the MPS prediction, as cpu is not MPS · shapes full — they differ here:")
    assert lines[at + 1] == ("  ≠ aten::convolution [float32×3] at model.py:12: predicted native, measured error on "
                             "cpu — RuntimeError: boom")
