"""Known MPS silent-correctness bugs (opscan/knowledge/silent_bugs.yaml, predict/silent.py): every entry flagged
on a crafted call at a release it affects and clean at its fixing release (gated by --macos and --chip where it
is), a mutation test (drop an entry: its case is no longer flagged), the data file's validation and signatures,
and real steps (tests/targets/silent.py) for each condition kind."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from opscan.knowledge import load_knowledge
from opscan.knowledge.silent_bugs import BUGS_PATH, load_bugs, parse_bugs
from opscan.knowledge.silent_bugs import bugs_for_release as for_release
from opscan.mps_view import MpsCall
from opscan.opkey import OpKey
from opscan.predict.silent import silent_verdict
from opscan.scan import ScanOptions, scan
from opscan.trace.records import TensorMeta
from opscan.verdict import Classification, Evidence, Verdict

TARGETS = os.path.join(os.path.dirname(__file__), "targets", "silent.py")
NATIVE = Classification(Verdict.NATIVE, Evidence("yaml-mps", "has a kernel", "native_functions.yaml"))


def meta(shape, stride=None, offset=0, dtype="float32", host=False, grad=False):
    """A recorded tensor (contiguous unless `stride` says otherwise)."""
    if stride is None:
        stride, step = [], 1
        for d in reversed(shape):
            stride.insert(0, step)
            step *= max(d, 1)
    return TensorMeta(dtype, tuple(shape), tuple(stride), "cpu", 1, 0, offset, grad, host)


def call(op, inputs, attrs=None, outputs=(), group=None, cpu_op=None, rule=None):
    """An MPS-view call; `attrs` default to one "<tensor>" per input."""
    attrs = tuple(attrs) if attrs is not None else ("<tensor>",) * len(inputs)
    return MpsCall(0, OpKey.from_yaml(op), "forward", "block", tuple(inputs), tuple(outputs),
                   tuple(t.dtype for t in inputs), cpu_op, rule, None, attrs, group)


def linear(x, w, b=None):
    """The lens's linear group call F.linear(x, w, b)."""
    tensors = [x, w] + ([b] if b is not None else [])
    metas = tuple((t.dtype, t.shape, t.stride, t.offset, t.requires_grad) for t in tensors)
    spec = {"args": [{"t": 0}, {"t": 1}, {"t": 2} if b is not None else None], "kwargs": {}}
    return call("linear", [w], outputs=[meta((*x.shape[:-1], w.shape[0]))], group=(metas, spec), rule="mps-linear")


def sdpa(q, k, v):
    """The lens's attention group call (no grad: MPS's own kernel)."""
    metas = tuple((t.dtype, t.shape, t.stride, t.offset, t.requires_grad) for t in (q, k, v))
    spec = {"args": [{"t": 0}, {"t": 1}, {"t": 2}], "kwargs": {}}
    return call("_scaled_dot_product_attention_math_for_mps", [q], group=(metas, spec), rule="mps-sdpa")


def conv(x, w, backward=False):
    """_mps_convolution (or its backward) as the view makes it from aten::convolution."""
    if backward:
        attrs = ("<tensor>", "<tensor>", "<tensor>", [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                 [True, True, True])
        return call("mps_convolution_backward", [x, x, w], attrs, cpu_op=OpKey.from_yaml("convolution_backward"),
                    rule="mps-convolution")
    attrs = ("<tensor>", "<tensor>", None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return call("_mps_convolution", [x, w], attrs, cpu_op=OpKey.from_yaml("convolution"), rule="mps-convolution")


BIG = 2 ** 31 + 2 ** 20
CL = meta((2, 4, 3, 3), (36, 1, 12, 4))  # channels_last
CL_SLICE = meta((2, 2, 3, 3), (36, 1, 12, 4))  # x_cl[:, :2]: looks channels_last, is not packed
T = meta((8, 4), (1, 8))  # transposed
# entry id -> (call, release it affects, its fixing release or None when open, macos, chip)
CASES = {
    "161640": (linear(meta((4, 8)), meta((4, 8), (16, 1))), "2.8.0", "2.9.0", "15.0", None),
    "133520": (call("native_batch_norm", [meta((2, 4, 6, 6), offset=144), meta((4,)), meta((4,))],
                    ("<tensor>", "<tensor>", "<tensor>", None, None, True, 0.1, 1e-5)), "2.4.0", "2.5.0", None, None),
    "187117": (call("mul.Tensor", [meta((4, 8)), meta((), (), offset=3, host=True)]), "2.12.0", "2.14.0", None, None),
    "145203": (call("bitwise_xor_.Scalar", [meta((3,), (4,), dtype="int16")], ("<tensor>", 3)), "2.5.0", "2.7.0",
               "15.0", None),
    "197636": (call("bmm", [meta((65537, 256, 64)), meta((65537, 64, 256), (16384, 1, 64))]), "2.14.1", None, None,
               None),
    "189495": (linear(meta((65537, 11, 128)), meta((512, 128)), meta((512,))), "2.12.0", "2.14.0", "15.0", None),
    "163597": (sdpa(meta((1, 2, 4, 64), (512, 64, 128, 1)), meta((1, 2, 4, 64)), meta((1, 2, 4, 64))), "2.8.0",
               "2.9.0", None, None),
    "181133": (sdpa(*[meta((4, 3, 3, 64), (576, 64, 192, 1))] * 3), "2.10.0", "2.12.0", None, None),
    "192212": (conv(meta((1, 3, 8, 8)), meta((4, 3, 3, 3), (27, 1, 9, 3))), "2.13.0", "2.14.0", "15.0", None),
    "140902": (conv(meta((2, 4, 6, 6), (144, 1, 24, 4)), meta((4, 3, 3, 3)), backward=True), "2.5.0", "2.6.0",
               None, None),
    "180201": (call("mm", [meta((4, 8), (0, 0)), meta((8, 3))]), "2.11.0", "2.12.0", "15.0", None),
    "124621": (call("mse_loss", [T, T], ("<tensor>", "<tensor>", 0)), "2.3.0", "2.4.0", None, None),
    "124834": (call("elu", [T], ("<tensor>", 1.0, 1, 1)), "2.3.0", "2.4.0", None, None),
    "151460": (call("bitwise_not_", [meta((4,), (2,), dtype="int32")]), "2.7.0", "2.8.0", None, None),
    "180984": (call("avg_pool2d", [CL_SLICE], ("<tensor>", [2, 2])), "2.12.0", "2.13.0", None, None),
    "188756": (call("index_select", [meta((2 ** 16, 2 ** 15 + 1)), meta((3,), dtype="int64")],
                    ("<tensor>", 0, "<tensor>")), "2.13.0", "2.14.0", None, None),
    "180776": (linear(meta((2, 13, 1024), dtype="float16"), meta((8, 1024), dtype="float16")), "2.12.0", "2.13.0",
               "26.4", "M5"),
    "188438": (linear(meta((80, 1, 2)), meta((4, 2)), meta((4,))), "2.13.0", "2.14.0", "26.0", "M1"),
    "116769": (call("mm", [meta((1024, 1)), meta((1, 32769))]), "2.2.0", "2.3.0", "14.1", None),
    "174345": (call("avg_pool2d", [meta((2, 4, 3, 3), (36, 1, 12, 4), offset=36)], ("<tensor>", [2, 2])),
               "2.11.0", "2.12.0", None, None),
    "110120": (call("masked_fill_.Scalar", [T, meta((8, 4), dtype="bool")], ("<tensor>", "<tensor>", 0.0)),
               "2.1.0", "2.2.0", None, None),
    "195163": (call("bmm", [meta((2, 16, 32768)), meta((2, 32768, 16))]), "2.14.1", None, None, "M2"),
}


def judged(case_call, release, macos=None, chip=None, path=BUGS_PATH):
    """The verdict of a call for `release` under the entries in `path`."""
    kb = load_knowledge(release=release, macos=macos, chip=chip)
    kb = dataclasses.replace(kb, silent=for_release(release, path))
    return silent_verdict(case_call, kb, NATIVE)


def test_every_case_is_an_entry():
    """The first 22 entries' crafted calls (every entry is traced from its reporter's repro in
    tests/test_silent_repros.py)."""
    assert set(CASES) <= {b.id for b in load_bugs()}
    assert len(CASES) == 22


@pytest.mark.parametrize("bug_id", sorted(CASES))
def test_each_entry_flags_its_call_at_an_affected_release_and_not_at_its_fix(bug_id):
    found_call, bad, fixed, macos, chip = CASES[bug_id]
    found = judged(found_call, bad, macos, chip)
    assert found.verdict == Verdict.MISMATCH and found.evidence.rule == f"silent-bug-{bug_id}", found.evidence.text
    assert "silent-correctness bug" in found.evidence.text and found.remedy
    bug = {b.id: b for b in load_bugs()}[bug_id]
    assert bug.workaround in found.remedy
    assert (f"torch {bug.fixed_in} fixes it" if fixed else "open") in found.remedy
    if fixed is not None:
        assert judged(found_call, fixed, macos, chip).verdict == Verdict.NATIVE


@pytest.mark.parametrize("bug_id", sorted(CASES))
def test_dropping_an_entry_unflags_its_call(bug_id, tmp_path):
    """Mutation: the knowledge base without the entry does not find its case."""
    data = yaml.safe_load(open(BUGS_PATH, encoding="utf-8"))
    data["entries"] = [e for e in data["entries"] if str(e["id"]) != bug_id]
    path = tmp_path / "silent_bugs.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    found_call, bad, _, macos, chip = CASES[bug_id]
    assert judged(found_call, bad, macos, chip, str(path)).evidence.rule != f"silent-bug-{bug_id}"


@pytest.mark.parametrize("bug_id", sorted(i for i, case in CASES.items() if case[3]))
def test_a_macos_gated_entry_needs_that_macos(bug_id):
    """Gated by --macos: at the release's minimum macOS (not given) it is a note; on a macOS outside its range
    (given) nothing."""
    found_call, bad, _, macos, chip = CASES[bug_id]
    bug = {b.id: b for b in load_bugs()}[bug_id]
    default = judged(found_call, bad, None, chip)
    if not bug.macos_applies(load_knowledge(release=bad).macos):
        assert default.verdict == Verdict.NATIVE and "give --macos to decide" in default.evidence.text
    outside = "13.0" if bug.macos[0] and bug.macos[0] > (13, 0) else "27.0"
    assert judged(found_call, bad, outside, chip).verdict == Verdict.NATIVE


def test_a_chip_limited_entry_is_a_note_without_chip_and_decides_with_it():
    found_call = CASES["195163"][0]
    none = judged(found_call, "2.14.1")
    assert none.verdict == Verdict.NATIVE and "M1/M2 chips only: give --chip" in none.evidence.text
    assert judged(found_call, "2.14.1", chip="Apple M2 Max").evidence.rule == "silent-bug-195163"
    other = judged(found_call, "2.14.1", chip="M3")
    assert other.verdict == Verdict.NATIVE and "note" not in other.evidence.text


def test_conditions_that_do_not_hold_leave_the_call_alone():
    contiguous = linear(meta((4, 8)), meta((4, 8)))
    assert judged(contiguous, "2.8.0") is NATIVE
    whole = call("native_batch_norm", [meta((2, 4, 6, 6)), meta((4,)), meta((4,))],
                 ("<tensor>", "<tensor>", "<tensor>", None, None, True, 0.1, 1e-5))
    assert judged(whole, "2.4.0") is NATIVE
    on_device = call("mul.Tensor", [meta((4, 8)), meta((), (), offset=3)])  # the 0-dim view is on MPS too
    assert judged(on_device, "2.13.0") is NATIVE
    unknown = call("mul.Tensor", [meta((4, 8)), meta((), (), offset=3, host=True)])  # an error verdict stays
    kb = load_knowledge(release="2.13.0")
    error = Classification(Verdict.ERROR, Evidence("kernel-x", "raises", "src"))
    assert silent_verdict(unknown, kb, error) is error


def test_a_solve_entry_reads_batch_broadcasting_only():
    """#189134 is batch broadcasting of a matrix right-hand side (A (1, 3, 3), B (4, 3, 2)): its condition slices
    the batch dimensions (A.shape[:-2]); a vector right-hand side or equal batches are no such call."""
    def solve(a, b):
        return call("_linalg_solve_ex", [meta(a), meta(b)], ("<tensor>", "<tensor>", True, False))

    assert judged(solve((1, 3, 3), (4, 3, 2)), "2.13.0").evidence.rule == "silent-bug-189134"
    assert judged(solve((4, 3, 3), (3, 2)), "2.13.0").evidence.rule == "silent-bug-189134"
    for a, b in (((3, 3), (3,)), ((3, 3), (3, 2)), ((4, 3, 3), (4, 3)), ((4, 3, 3), (4, 3, 2))):
        assert judged(solve(a, b), "2.13.0") is NATIVE, (a, b)


def test_argmax_of_int64_on_arm64_is_no_entry():
    """The argmax reports (#98191 and its duplicates) all ran an x86_64 Python: argmax of an int64 tensor on the
    arm64 wheels is not flagged (tools/silent/triage.yaml says why)."""
    assert judged(call("argmax", [meta((10, 2), dtype="int64")], ("<tensor>", 1, False)), "2.0.0") is NATIVE


def test_the_data_file_is_validated():
    text = open(BUGS_PATH, encoding="utf-8").read()
    bugs = parse_bugs(text)
    assert len(bugs) >= 22 and len({b.id for b in bugs}) == len(bugs)
    data = yaml.safe_load(text)
    bad = dict(data, entries=[dict(data["entries"][0], affected=["2.9.0", "2.8"])])
    with pytest.raises(ValueError, match="affected"):
        parse_bugs(yaml.safe_dump(bad))
    bad = dict(data, entries=[dict(data["entries"][0], when="input.is_contiguous()")])
    with pytest.raises(ValueError, match="only len, any, all may be called"):
        parse_bugs(yaml.safe_dump(bad))
    bad = dict(data, entries=[dict(data["entries"][0], ops=["linear", "gelu"])])
    with pytest.raises(ValueError, match="gelu"):
        parse_bugs(yaml.safe_dump(bad))


def _scan(factory, release, **kw):
    return scan(ScanOptions(f"{TARGETS}:{factory}", torch_version=release, memory=False, **kw))


def _rule(report, op):
    rows = [r for r in report.rows if r.op.display == op]
    assert rows, [r.op.display for r in report.rows]
    return max(rows, key=lambda r: r.verdict.rank)


def test_batch_norm_on_a_slice_of_resnet_stem_is_flagged_at_2_4_and_clean_at_2_5():
    row = _rule(_scan("slice_into_norm", "2.4.0"), "aten::native_batch_norm")
    assert row.verdict == Verdict.MISMATCH and row.evidence.rule == "silent-bug-133520"
    assert row.silent["modules"] == ["bn1"] and "in bn1: x[5:].contiguous()" in row.remedy
    assert row.since == "2.5.0" and row.silent["calls"][0]["inputs"][0]["offset"] > 0
    assert _rule(_scan("slice_into_norm", "2.5.0"), "aten::native_batch_norm").verdict == Verdict.NATIVE


def test_linear_with_a_sliced_weight_is_flagged_at_2_8_only():
    import json

    import jsonschema

    report = _scan("sliced_weight", "2.8.0", macos="15.0")  # the no-graph path runs on macOS 15+ only
    schema = json.load(open(os.path.join(os.path.dirname(TARGETS), "..", "..", "opscan", "schema",
                                         "report-v4.json"), encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(report.to_dict())))
    row = _rule(report, "aten::linear")
    assert row.evidence.rule == "silent-bug-161640" and report.lane.name.value == "linux-gpu-first"
    assert report.upgrade["target"] is not None and report.upgrade["first_native"] == "2.9.0"
    assert _rule(_scan("sliced_weight", "2.9.0", macos="15.0"), "aten::linear").verdict == Verdict.NATIVE
    at_the_minimum = _rule(_scan("sliced_weight", "2.8.0"), "aten::linear")  # macOS 14: the graph path, a note
    assert at_the_minimum.verdict == Verdict.NATIVE and "give --macos to decide" in at_the_minimum.evidence.text


@pytest.mark.parametrize("factory", ["denoiser", "schedule_in_step"])
def test_a_cpu_schedule_view_times_an_mps_tensor_is_flagged_at_2_12_and_2_13_not_2_14(factory):
    for release in ("2.12.0", "2.13.0"):
        row = _rule(_scan(factory, release), "aten::mul.Tensor")
        assert row.evidence.rule == "silent-bug-187117", (release, row.evidence.text)
        assert row.silent["calls"][0]["inputs"][1] == {"dtype": "float32", "shape": [], "stride": [], "offset": 3,
                                                       "device": "cpu"}
    assert _rule(_scan(factory, "2.14.0"), "aten::mul.Tensor").verdict == Verdict.NATIVE


def test_a_schedule_moved_with_the_model_is_not_flagged():
    assert _rule(_scan("on_device", "2.13.0"), "aten::mul.Tensor").verdict == Verdict.NATIVE


def test_bitwise_into_a_column_is_gated_by_macos_15_at_2_5_and_2_6_not_2_7():
    for release in ("2.5.0", "2.6.0"):
        row = _rule(_scan("column_xor", release, macos="15.0"), "aten::bitwise_xor_.Tensor")
        assert row.evidence.rule == "silent-bug-145203"
        noted = _rule(_scan("column_xor", release), "aten::bitwise_xor_.Tensor")
        assert noted.verdict == Verdict.NATIVE and "give --macos to decide" in noted.evidence.text
    assert _rule(_scan("column_xor", "2.7.0", macos="15.0"),
                 "aten::bitwise_xor_.Tensor").verdict == Verdict.NATIVE


def test_a_bmm_over_2_to_the_32_elements_is_flagged_through_fake_tensors_in_every_release():
    # from macOS 15 the MPS kernel tiles such a bmm (and gets it wrong, #197636); below 15 it raises "Tiling of batch
    # matmul for larger than 2**32 entries only available from MacOS15 onwards" (kernel_checks.txt kc-5b0b335c),
    # which rule 4c decides first at 2.14.1's minimum macOS 14.0 (issue 38)
    report = _scan("long_bmm", "2.14.1", fake=True, inference=True, macos="15.0")
    row = _rule(report, "aten::bmm")
    assert row.evidence.rule == "silent-bug-197636" and "open" in row.remedy and row.since is None
    assert report.to_dict()["ops"][report.rows.index(row)]["silent"]["fixed_in"] == "open"
    below = _rule(_scan("long_bmm", "2.14.1", fake=True, inference=True), "aten::bmm")
    assert below.evidence.rule == "kernel-bmm-tiling-macos-15" and below.verdict == Verdict.ERROR


def test_every_entrys_fixing_release_follows_from_its_merge_day_and_the_branch_cuts():
    """tools/silent/establish.py: fixed_in is the first release cut after the fix merged (a named cherry-pick
    excepted), and the calendar's rules give what its docstring says."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "silent"))
    import establish

    assert establish.disagreements(load_bugs()) == []
    assert establish.fixing_release("2026-04-14") == "2.12.0"  # the day before the 2.12 cut
    assert establish.fixing_release("2026-04-15") == "2.13.0"  # the cut's own day: the next release
    assert establish.fixing_release("2026-08-12") == "open"  # after the last covered cut
    assert establish.current_release("2026-05-12") == "2.11.0" and establish.current_release("2026-05-13") == "2.12.0"
    assert establish.current_release("2023-02-01") is None


def test_the_recorded_recall_is_of_the_current_entries():
    """tools/silent/recall.json (docs/silent-bugs.md's recall section) splits today's entries at its day: rerun
    tools/silent/recall.py DAY --write when an entry is added or its day changes."""
    import datetime
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = json.load(open(os.path.join(root, "tools", "silent", "recall.json"), encoding="utf-8"))
    day = datetime.date.fromisoformat(result["day"])
    bugs = load_bugs()
    after = {b.id for b in bugs if datetime.date.fromisoformat(b.reported) >= day}
    assert {h["id"] for h in result["bugs"]} == after and result["base"] == len(bugs) - len(after)
    assert result["predicted"] == sum(bool(h["predicted_by"]) for h in result["bugs"])


def test_the_triage_accounts_for_every_report_and_the_doc_is_current():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = yaml.safe_load(open(os.path.join(root, "tools", "silent", "triage.yaml"), encoding="utf-8"))
    triage = data["records"]
    assert len(triage) >= 194 and len({r["id"] for r in triage}) == len(triage)
    ids = {b.id for b in load_bugs()}
    assert {r["entry"] for r in triage if r["outcome"] == "entry"} == ids
    assert {r["outcome"] for r in triage} <= {"entry", "not an entry", "not encodable", "out of scope"}
    assert all(r.get("reason") for r in triage if r["outcome"] != "entry")
    unestablished = ("not established", "release unknown", "not dated", "release not found", "releases not found")
    assert not [r["id"] for r in triage if any(p in r.get("reason", "").lower() for p in unestablished)]
    assert all(q["query"] and q["corpus"] and q["count"] >= 0 for q in data["searches"])
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    assert f"Known silent-correctness bugs: {len(ids)} entries" in readme and f"{len(triage)} reports" in readme
    tool = os.path.join(root, "tools", "silent_bugs_doc.py")
    assert subprocess.run([sys.executable, tool, "--check"], cwd=root).returncode == 0


def test_the_triage_records_that_are_not_entries_carry_their_releases_by_the_entries_rules():
    """Issue 34: a report left out of the base keeps the releases established for it (`affected`, `fixed_in`,
    `macos`, `established`, `confidence`) by tools/silent/establish.py's rules, or says what was searched; a `when`
    it names is in the condition language, so the next round can add it as it stands."""
    import datetime
    import sys

    from opscan.knowledge.conditions import compile_when

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tools", "silent"))
    import establish

    triage = yaml.safe_load(open(os.path.join(root, "tools", "silent", "triage.yaml"), encoding="utf-8"))["records"]
    dated = [r for r in triage if r["outcome"] != "entry" and "confidence" in r]
    assert len(dated) >= 18 and {r["confidence"] for r in dated} <= {"high", "medium", "low"}
    series = {s for s, _, _ in establish.calendar()}
    for r in dated:
        assert r["established"], r["id"]
        if r.get("affected") is None:  # no release found: the record says what was searched
            assert r["kind"] == "test" and "searched" in r["established"], r["id"]
            continue
        first, last = r["affected"]
        assert first.rsplit(".", 1)[0] in series and last in series, r["id"]
        if r.get("reported"):
            datetime.date.fromisoformat(r["reported"])
        merged, fixed = r.get("fix_merged"), r.get("fixed_in")
        if merged and fixed != "open" and "cherry-pick" not in r["established"]:
            assert establish.fixing_release(merged) == fixed, r["id"]
    for r in triage:
        when = r.get("when")
        for condition in (when.values() if isinstance(when, dict) else [when] if when else []):
            compile_when(condition)
