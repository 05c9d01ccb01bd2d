"""Every runtime check of the MPS kernels decided (issue 38): encoded by kernel_rules.yaml, or decided not to be with
a reason of kernel_decisions.yaml — 0 undecided — and docs/knowledge-base.md's table is the tool's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from opscan.knowledge.kernel_checks import load_checks
from opscan.knowledge.kernel_decisions import (ENCODED, UNDECIDED, decide_check, decide_all, load_decisions, load_twins,
                                               parse_decisions)

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("kernel_decisions_tool", ROOT / "tools" / "kernel_decisions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_check_is_undecided():
    undecided = [c.id for c, d in decide_all().values() if d.status == UNDECIDED]
    assert undecided == []


def test_the_docs_table_is_the_tools():
    tool = _tool()
    doc = (ROOT / "docs" / "knowledge-base.md").read_text(encoding="utf-8")
    from opscan.knowledge.kernel_decisions import decision_table

    assert tool.doc_with_table(doc, decision_table()) == doc, "run python tools/kernel_decisions.py table --write"


def test_conv3d_is_encoded_and_other_means_decided_not_to_encode():
    decided = decide_all()
    assert decided["kc-672882ca"][1].status == ENCODED  # Conv3D, kind other: now a rule (kernel-conv3d)
    others = [d for c, d in decided.values() if c.kind == "other" and d.status != ENCODED]
    assert others and all(d.status in load_decisions().reasons for d in others)


def test_every_decision_names_a_known_check_and_every_twin_one_too():
    ids = {c.id for c in load_checks().checks}
    assert set(load_decisions().checks) <= ids
    assert set(load_twins()) <= ids


def test_a_per_check_note_wins_over_the_classes_and_a_class_needs_a_known_reason():
    decisions = parse_decisions("""
reasons: {value: "values", device: "devices"}
classes: [{reason: device, match: "same device"}]
checks: {kc-1: {reason: value, note: "a note"}}
""")
    check = next(c for c in load_checks().checks if "same device" in c.message)
    assert decide_check(check, None, decisions, {}).status == "device"
    from dataclasses import replace

    assert decide_check(replace(check, id="kc-1"), None, decisions, {}).text.endswith("a note")
    with pytest.raises(ValueError):
        parse_decisions("reasons: {a: b}\nclasses: [{reason: nope}]\n")
    with pytest.raises(ValueError):
        parse_decisions("reasons: {a: b}\nchecks: {kc-1: {reason: a}}\n")  # a per-check decision needs its note


def test_an_encoded_check_without_an_op_is_unattached_not_encoded():
    check = next(c for c in load_checks().checks if not c.ops and c.kind == "dtype")
    from opscan.knowledge.kernel_rules import load_kernel_rules

    rule = next((r for p in load_kernel_rules().patterns if (r := p.rule(check))), None) or object()
    assert decide_check(check, rule, load_decisions(), load_twins()).status == "unattached"
