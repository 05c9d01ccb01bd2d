"""The trust spine on its own (opscan/trust, issue 27): the one reader's limits, the one path sanitiser, the
writers' escapers, the bundle record's comparison, and the renderers that use them — no subprocess, no trace.
The same promises through `python -m opscan` are tests/test_hostile_trust.py's."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from opscan.errors import UsageError
from opscan.trust.names import MAX_NAME, inside, safe_name
from opscan.trust.read import MAX_DEPTH, MAX_NODES, Malformed, json_value, read_json, read_yaml, yaml_value
from opscan.trust.text import (ascii_text, comment_text, csv_cell, inline_code, printable, script_json,
                               xml_text)

ESC = "\x1b[2J\x1b]0;title\x07"


# --- the reader ------------------------------------------------------------------------------------------------


def test_item_09_json_nested_past_the_limit_is_malformed_not_a_recursion_error():
    assert json_value("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None  # at the limit: read
    for depth in (MAX_DEPTH + 1, 100_000):
        with pytest.raises(Malformed, match=f"nested deeper than {MAX_DEPTH} levels"):
            json_value("[" * depth + "]" * depth)
    with pytest.raises(Malformed, match="nested deeper"):
        json_value('{"a":' * 70 + "1" + "}" * 70)


def test_item_09_yaml_nested_past_the_limit_is_malformed_before_it_is_built():
    assert yaml_value("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)) is not None  # the mapping is one level
    with pytest.raises(Malformed, match="nested deeper"):
        yaml_value("a: " + "[" * 100_000 + "]" * 100_000)


def test_item_03_an_alias_bomb_is_refused_before_anything_is_built():
    levels = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert len(levels) < 700
    with pytest.raises(Malformed, match=f"expand it to more than {MAX_NODES} values"):
        yaml_value(levels)
    shared = "defaults: &d {mode: train, fake: auto}\nmodels:\n" + "".join(
        f"  m{i}: {{<<: *d, target: 'x.py:f'}}\n" for i in range(500))
    assert len(yaml_value(shared)["models"]) == 500  # ordinary anchors and merge keys are fine


def test_item_10_reader_refuses_files_that_are_not_utf8_too_large_or_missing(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"seed: 1 # \xe9\n")
    with pytest.raises(UsageError, match=r"spec .*spec.yaml is not UTF-8 text \(byte 10: invalid continuation"):
        read_yaml(path, "spec", "fix it")
    path.write_text("a: " + "x" * 200)
    with pytest.raises(UsageError, match=r"is larger than opscan reads \(203 bytes, at most 100\) — fix it"):
        read_yaml(path, "spec", "fix it", max_bytes=100)
    with pytest.raises(UsageError, match=r"cannot read the baseline .*nope.json: No such file .*FileNotFound"):
        read_json(tmp_path / "nope.json", "the baseline", "pass one")
    path.write_text("{not json")
    with pytest.raises(UsageError, match=r"is not an opscan report.json \(JSONDecodeError at line 1 column 2"):
        read_json(path, "the baseline", "pass one", expected="an opscan report.json")


def test_the_reader_raises_the_callers_error_class(tmp_path):
    class SpecError(UsageError):
        pass

    (tmp_path / "s.yaml").write_text("a: [1\n")
    with pytest.raises(SpecError, match=r"is not valid YAML \(line 2"):
        read_yaml(tmp_path / "s.yaml", "spec", "fix", error=SpecError)


# --- the path sanitiser ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, name", [
    ("..", "_."), (".", "_"), ("../x", "_._x"), ("a/b\\c", "a_b_c"), ("", "model"), (ESC + "x", "__2J__0_title_x"),
    ("ResNet", "ResNet"), ("aten_add.Tensor", "aten_add.Tensor"), ("ü-net_2", "ü-net_2"), ("\u202eevil", "_evil"),
])
def test_item_02_safe_name_makes_one_plain_path_component(text, name):
    assert safe_name(text) == name


def test_item_02_long_names_are_bounded_and_stay_apart():
    a, b = safe_name("x" * 300 + "a"), safe_name("x" * 300 + "b")
    assert len(a) == len(b) == MAX_NAME and a != b


def test_item_02_inside_refuses_any_path_that_leaves_its_folder(tmp_path):
    assert inside(tmp_path, "repro/aten_take/ISSUE.md") == tmp_path / "repro" / "aten_take" / "ISSUE.md"
    for bad in ("../x", "/etc/passwd", "a/../../b", "repro/../../x", "a\\b", "", ".hidden", "a/\x1b/b"):
        with pytest.raises(ValueError):
            inside(tmp_path, bad)
    assert inside(tmp_path, "a//b/.") == tmp_path / "a" / "b"  # what pathlib normalises stays inside


def test_item_02_repro_folders_of_op_names_go_through_the_sanitiser():
    from opscan.repro import folder_of

    assert folder_of("aten::add.Tensor") == "aten_add.Tensor" and folder_of("aten::take") == "aten_take"
    long = folder_of("mylib::" + "x" * 300)  # a custom op's name is the target's: bounded like every name
    assert len(long) == MAX_NAME and safe_name(long) == long


# --- the escapers ---------------------------------------------------------------------------------------------


def test_item_04_printable_escapes_control_and_escape_sequences():
    assert printable(f"mod{ESC}\u202ex\nnext") == "mod\\x1b[2J\\x1b]0;title\\x07\\u202ex\nnext"
    assert printable("a\nb\tc\rd", newlines=False) == "a\\x0ab\\x09c\\x0dd"
    assert printable("naïve · ≠") == "naïve · ≠"  # printable text is left alone


def test_item_04_the_table_prints_module_names_and_evidence_escaped():
    from helpers_report import report, row
    from opscan.render.console import render_table
    from opscan.verdict import Verdict

    rows = (row("aten::take", ["float32"], Verdict.UNSUPPORTED, [f"enc{ESC}"], text=f"raised: {ESC} boom"),)
    for color in (False, True):
        text = render_table(report(rows=rows), verbose=True, color=color)
        assert "\x07" not in text and "\x1b]" not in text and "\x1b[2J" not in text
        assert "\\x1b[2J" in text
    assert "\x1b" not in render_table(report(rows=rows), verbose=True, color=False)


def test_item_05_xml_text_keeps_junit_and_graphml_well_formed():
    from helpers_report import report, row
    from opscan.render.junit import render_junit
    from opscan.verdict import Verdict

    assert xml_text("a\x01b\x0bc\ud800\ufffe\td") == "a\\x01b\\x0bc\\ud800\\ufffe\td"
    rows = (row("aten::take", ["float32"], Verdict.UNSUPPORTED, [f"enc\x01{ESC}"], text="x\x00y"),)
    root = ET.fromstring(render_junit(report(rows=rows), fail_on="unsupported"))
    assert root.find(".//testcase").get("classname") == "opscan.enc\\x01\\x1b[2J\\x1b]0;title\\x07"


def test_item_05_graphml_of_control_character_names_parses():
    import networkx as nx

    from opscan.graph.views import graphml_text

    g = nx.DiGraph()
    g.add_node("a\x01b", module=f"m{ESC}", kind="call")
    g.add_edge("a\x01b", "c", bytes=4)
    parsed = nx.read_graphml(io.BytesIO(graphml_text(g).encode()))
    assert set(parsed.nodes) == {"a\\x01b", "c"} and parsed.nodes["a\\x01b"]["module"] == "m\\x1b[2J\\x1b]0;title\\x07"


def test_item_06_script_json_cannot_close_or_open_anything_in_html():
    value = {"name": "</script><!--<script>a&b-->", "line": "\u2028"}
    text = script_json(value)
    assert not set("<>&\u2028") & set(text) and json.loads(text) == value


def test_item_07_csv_cells_that_start_a_formula_are_neutralised():
    assert [csv_cell(v) for v in ("=1+1", "+1", "-1", "@A1", "\tx", "plain", 5, None)] == \
        ["'=1+1", "'+1", "'-1", "'@A1", "'\tx", "plain", 5, None]


def test_item_07_leaderboard_csv_of_formula_names():
    from opscan.zoo.board import ModelResult, make_board
    from opscan.zoo.models import ZooModel
    from opscan.zoo.outputs import render_csv

    result = ModelResult(ZooModel("=cmd|' /C calc'!A0", "x.py:f"), (), 1.0, error="-boom")
    rows = list(csv.reader(io.StringIO(render_csv(make_board("t", ("2.14.1",), [result])))))
    assert rows[1][0] == "'=cmd|' /C calc'!A0" and rows[1][-1] == "'-boom"


def test_item_08_comment_text_cannot_end_a_comment():
    for text in ("0.1 --> <script>", "-->", "--!>", ">x", "a---b", "<!-- x", "x-"):
        inner = comment_text(text)
        assert "--" not in inner and not inner.startswith(">") and "<!" not in inner, (text, inner)
    assert inline_code("a`b\nc") == "a'b\\x0ac"


def test_item_12_ascii_text_spells_the_table_characters():
    assert ascii_text("a · b — c × ≠ … é") == "a - b -- c x != ... \\xe9"


# --- the bundle record ----------------------------------------------------------------------------------------


def test_item_01_the_record_comparison_names_each_changed_field():
    from opscan.bundle.record import changes

    made = {"target": "m.py:f", "scan": {"target": "m.py:f", "args": {}}, "bundle_hash": "a"}
    got = {"target": "m.py:f", "scan": {"target": "os:system", "args": {"command": "'rm'"}}, "bundle_hash": "b"}
    assert changes(made, got) == ["scan.args.command: was null, is now \"'rm'\"",
                                  "scan.target: was 'm.py:f', is now 'os:system'", "bundle_hash: was 'a', is now 'b'"]


def test_item_01_a_bundle_hash_that_is_not_one_has_no_record():
    from opscan.bundle.record import UntrustedBundleError, record_path

    for bad in ("../../x", "0" * 63, None, 5):
        with pytest.raises(UntrustedBundleError, match="no valid bundle_hash"):
            record_path(bad)


# --- item 15: registrations -----------------------------------------------------------------------------------


def test_item_15_compiled_extension_ops_have_no_registration_python_ones_do():
    import torch
    import torchvision  # noqa: F401 - registers torchvision's compiled ops

    from opscan.opkey import OpKey
    from opscan.trace.registrations import registration_of

    assert registration_of(OpKey("torchvision", "nms", "default")) is None  # its CPU kernel is C++
    assert registration_of(OpKey("aten", "add", "Tensor")) is None
    assert registration_of(OpKey("nosuch", "op", "default")) is None
    lib = torch.library.Library("trustunit", "DEF")
    try:
        lib.define("cpu_only(Tensor x) -> Tensor")
        lib.impl("cpu_only", lambda x: x, "CPU")
        reg = registration_of(OpKey("trustunit", "cpu_only", "default"))
        assert reg is not None and reg.kernels == ("CPU",) and not reg.mps and reg.composite is None
        assert reg.at.endswith("test_trust_units.py")
    finally:
        lib._destroy()


def test_item_15_the_rule_decides_from_the_kernels():
    from opscan.knowledge import load_knowledge
    from opscan.opkey import OpKey
    from opscan.predict.rules import predict_op
    from opscan.trace.registrations import Registration
    from opscan.verdict import Verdict

    kb, op = load_knowledge(), OpKey("mylib", "f", "default")
    cases = {("CPU",): (Verdict.UNSUPPORTED, "target-registration-no-mps"),
             ("CPU", "MPS"): (Verdict.NATIVE, "target-registration-mps"),
             ("CompositeExplicitAutograd", "Meta"): (Verdict.UNKNOWN, "target-registration-composite")}
    for kernels, (verdict, rule) in cases.items():
        found = predict_op(op, ("float32",), kb, registration=Registration(kernels, "model.py"))
        assert (found.verdict, found.evidence.rule) == (verdict, rule)
    assert predict_op(op, ("float32",), kb).evidence.rule == "namespace-no-table"  # no registration: as before
