"""Tests of the knowledge stage: the yaml index, facts.yaml, torchvision.yaml, common_mps.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from opscan.knowledge import KnowledgeError, default_yaml_path, installed_release, load_knowledge
from opscan.knowledge.common_mps import installed_path, load_common_mps, opinfo_candidates
from opscan.knowledge.facts import load_facts, load_torchvision, parse_facts
from opscan.knowledge.kernel_rules import RULES_PATH, load_kernel_rules, parse_kernel_rules
from opscan.predict.runtime_checks import note_from_shapes, size_rule_fires
from opscan.knowledge.sources import op_record
from opscan.knowledge.yaml_index import essential_lines, index_entries
from opscan.opkey import OpKey, Release, ReleaseRange, macos_text, parse_macos

INSTALLED = installed_release()
K = OpKey.parse


@pytest.fixture(scope="module")
def kb():
    return load_knowledge()


@pytest.fixture(scope="module")
def raw_entries(kb):
    with open(default_yaml_path(), encoding="utf-8") as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


# --- native_functions.yaml -------------------------------------------------------------------


# Each release's counts come from its shipped knowledge-base entry, so they are checked under whatever torch is
# installed (CI's pytest venv has 2.14.1; its 2.13.0 venv checks that wheel against its entry: .ci/run).
def test_mps_kernels_on_2_14_1_are_549_explicit_plus_363_inherited():
    # mps_facts.md §2: 914 MPS registrations in the 2.14.1 dylib = 912 from the yaml
    # (549 explicit + 363 via structured_delegate) + embedding_renorm_ + _slow_conv2d_forward.
    explicit, inherited = load_knowledge(release="2.14.1").yaml.mps_counts()
    assert (explicit, inherited) == (549, 363)
    assert explicit + inherited == 912


def test_mps_kernels_on_2_13_0_are_533_explicit_plus_357_inherited():
    # measured by this index on the 2.13.0+cpu wheel (its yaml is byte-identical to macOS's).
    assert load_knowledge(release="2.13.0").yaml.mps_counts() == (533, 357)


def test_the_installed_wheel_counts_what_its_release_entry_says(kb):
    """Whatever torch is installed: the knowledge base for it is its shipped entry (the wheel's yaml is the one the
    entry was built from) and counts what the wheel's own files count; a release with no entry is built live."""
    from opscan.knowledge.build import read_installed
    from opscan.knowledge.entry import load_store
    from opscan.knowledge.optable import OpTable

    live = OpTable.from_records(read_installed().records(), "installed", "installed").mps_counts()
    assert kb.release == INSTALLED and kb.yaml.mps_counts() == live
    has_entry = load_store().line(INSTALLED) is not None
    assert (kb.origin, kb.entry is not None) == (("kb", True) if has_entry else ("live", False)), kb.notes


def test_cia_with_mps_holds_the_known_super_ops(kb):
    found = set(kb.cia_with_mps())
    assert {K("aten::linear"), K("aten::max_pool2d"), K("aten::_fused_rms_norm")} <= found
    if INSTALLED == "2.14.1":  # mps_facts.md §8 lists exactly these four for 2.14.1
        assert found == {K("aten::linear"), K("aten::max_pool2d"), K("aten::_fused_rms_norm"),
                         K("aten::mish_backward")}


def test_round_trip_of_every_overload_spelling(kb, raw_entries):
    names = [e["func"].partition("(")[0] for e in raw_entries]
    assert len(names) == len(set(names)) > 2000
    for name in names:
        key = OpKey.from_yaml(name)
        assert key.yaml_name == name
        assert key in kb.yaml.overloads
    for key in kb.yaml.overloads:  # declared and autogen'd
        assert OpKey.parse(key.display) == key
        assert OpKey.from_yaml(key.yaml_name) == key


def test_fast_path_indexes_like_the_whole_file(kb, raw_entries):
    # the shipped entry keeps, per overload, MPS, the composite keys, the delegate and the autogen origin
    assert {k: op_record(o) for k, o in index_entries(raw_entries).items()} == {
        k: op_record(o) for k, o in kb.yaml.overloads.items()}


def test_essential_lines_keep_dispatch_blocks_only():
    text = ("- func: a.out(Tensor self) -> Tensor\n  variants: function\n  dispatch:\n    CPU, MPS: a_out\n"
            "  tags: pointwise\n\n- func: a(Tensor self) -> Tensor\n  structured_delegate: a.out\n")
    assert essential_lines(text) == ("- func: a.out\n  dispatch:\n    CPU, MPS: a_out\n"
                                     "- func: a\n  structured_delegate: a.out")


def test_dispatch_keys_are_split_and_composites_are_classified(kb):
    take = kb.yaml.get(K("aten::take"))  # CPU and CUDA kernels: entries keep only MPS and composite keys
    assert take.dispatch == frozenset() and take.composite is None and kb.yaml.mps_kernel(take.key) is None
    assert kb.yaml.get(K("aten::adaptive_avg_pool1d")).implicit_cia  # no dispatch: at all
    linear = kb.yaml.get(K("aten::linear"))
    assert linear.cia and not linear.implicit_cia and kb.yaml.mps_kernel(linear.key) == "explicit"
    assert kb.yaml.get(K("aten::expand")).composite == "CompositeExplicitAutograd"
    assert kb.yaml.mps_kernel(K("aten::add.Tensor")) == "delegate"
    assert kb.yaml.get(K("aten::add.Tensor")).composite is None


def test_autogen_overloads_are_explicit_composites(kb):
    generated = kb.yaml.get(K("aten::_new_zeros_with_same_feature_meta.out"))
    assert generated.autogen_from == K("aten::_new_zeros_with_same_feature_meta")
    assert generated.composite == "CompositeExplicitAutograd"


def test_bad_yaml_is_rejected(tmp_path):
    bad = tmp_path / "native_functions.yaml"
    bad.write_text("just: a mapping\n")
    with pytest.raises(ValueError, match="native_functions.yaml"):
        from opscan.knowledge.sources import yaml_records
        yaml_records(bad.read_text())


# --- knowledge object ------------------------------------------------------------------------


def test_release_defaults_to_installed_without_local_suffix(kb):
    assert kb.release == INSTALLED and "+" not in kb.release
    assert load_knowledge(release="2.14.1+cu130").release == "2.14.1"


def test_kb_version_names_yaml_digest_and_facts(kb):
    assert re.fullmatch(r"yaml:[\w.]+:[0-9a-f]{12}\+facts:\d+:[0-9a-f]{8}", kb.kb_version)
    assert kb.yaml.sha256.startswith(kb.kb_version.split(":")[2].split("+")[0])


def test_load_is_cached(kb):
    assert load_knowledge() is kb


def test_unknown_release_is_a_user_error():
    covered = r"no knowledge-base entry for torch 1\.13\.1 \(covered: 2\.0\.0 … 2\.14\.1\)"
    with pytest.raises(KnowledgeError, match=covered):
        load_knowledge(release="1.13.1")
    with pytest.raises(KnowledgeError, match="not a torch release"):
        load_knowledge(release="nightly")
    with pytest.raises(KnowledgeError, match="not a macOS version"):
        load_knowledge(macos="sonoma")


def test_missing_yaml_is_a_user_error(tmp_path):
    with pytest.raises(KnowledgeError, match="not found"):
        load_knowledge(yaml_path=str(tmp_path / "nope.yaml"))


def test_loading_knowledge_never_imports_torch():
    code = ("import sys; from opscan.knowledge import load_knowledge; import opscan.predict.rules; "
            "load_knowledge(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- facts.yaml ------------------------------------------------------------------------------


ALL_SERIES = tuple(f"2.{m}" for m in range(15))


def test_facts_cover_every_release_series_with_sources():
    facts = load_facts()
    assert facts.series == ALL_SERIES
    for s in ALL_SERIES:
        rf = facts.for_release(s + ".0")
        assert K("aten::embedding_renorm_") in rf.always_cpu
        assert K("aten::_slow_conv2d_forward") in rf.error_stubs
        assert all(f.source for f in (*rf.always_cpu.values(), *rf.python_registrations.values()))
        assert rf.min_macos in {"12.3", "13.0", "14.0"} and rf.min_macos_source


def test_always_cpu_list_per_release():
    facts = load_facts()
    assert set(facts.for_release("2.14.1").always_cpu) == {K("aten::embedding_renorm_")}
    assert K("aten::linalg_svd.U") in facts.for_release("2.13.0").always_cpu
    assert len(facts.for_release("2.0.0").always_cpu) == 10  # mps_facts.md §1.2
    assert K("aten::linalg_vector_norm") not in facts.for_release("2.1.0").always_cpu
    assert facts.always_cpu_until(K("aten::linalg_svd"), "2.13.0") == "2.14"
    assert facts.always_cpu_until(K("aten::embedding_renorm_"), "2.13.0") is None


def test_python_registrations_and_distributed_rule():
    facts = load_facts()
    assert K("aten::var_mean.correction") in facts.for_release("2.2.0").python_registrations
    assert set(facts.for_release("2.12.0").python_registrations) == {
        K("aten::native_group_norm"), K("aten::native_group_norm_backward")}
    assert not facts.for_release("2.13.0").python_registrations
    assert facts.for_release("2.10.0").distributed_error is None
    assert facts.for_release("2.11.0").distributed_error is not None
    assert facts.for_release("2.14.1").min_macos == "14.0"
    assert facts.for_release("2.5.0").min_macos == "12.3"


def _raw_facts() -> dict:
    from opscan.knowledge.facts import FACTS_PATH
    with open(FACTS_PATH, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r["always_cpu"][0].pop("source"), r"missing \['source'\]"),
    (lambda r: r["always_cpu"][1]["releases"].append("2.0"), "repeated"),
    (lambda r: r["min_macos"].pop(), "min_macos covers"),
    (lambda r: r["always_cpu"][0]["ops"].append("not an op"), "not a valid operator"),
])
def test_bad_facts_fail_fast(breakage, message):
    raw = _raw_facts()
    breakage(raw)
    with pytest.raises(ValueError, match=message):
        parse_facts(raw)


def test_series_parsing():
    assert Release.parse("2.14.1+cu130").series == "2.14" and Release.parse("2.10").series == "2.10"
    with pytest.raises(ValueError):
        Release.parse("nightly")


def test_a_release_parses_compares_and_prints_in_one_place():
    local = Release.parse("2.14.1+cu130")
    assert (local.numbers, local.local, local.plain, str(local)) == ((2, 14, 1), "cu130", "2.14.1", "2.14.1+cu130")
    assert local == Release.parse("2.14.1") and local.series_key == (2, 14)  # the suffix never orders
    assert sorted(["2.10.0", "2.9.1", "2.10", "2.0.0"], key=Release.parse) == ["2.0.0", "2.9.1", "2.10", "2.10.0"]
    assert Release.drop_local("2.15.0a0+git1234") == "2.15.0a0"  # an installed dev build: stripped, not judged
    for bad in ("2", "2.x", "nightly", "2.14.1rc1", ""):
        with pytest.raises(ValueError, match="not a torch release"):
            Release.parse(bad)


def test_a_release_range_is_read_in_one_place_from_each_spelling():
    listed = ReleaseRange.parse(["2.3.1", "2.4"])  # kernel_rules.yaml: exact releases and whole series
    assert [r for r in ("2.3.0", "2.3.1", "2.4.0", "2.4.1", "2.5.0") if listed.covers(r)] == ["2.3.1", "2.4.0", "2.4.1"]
    dotted = ReleaseRange.parse("2.5.0..2.8.0")  # expectation_conditions.yaml, composite_paths.yaml
    assert (dotted.covers("2.4.1"), dotted.covers("2.5.0"), dotted.covers("2.8.0"), dotted.covers("2.8.1")) == \
        (False, True, True, False)
    pair = ReleaseRange.between("2.8.0", "2.11")  # silent_bugs.yaml's `affected`: a series last takes its patches
    assert (pair.covers("2.7.1"), pair.covers("2.8.0"), pair.covers("2.11.3"), pair.covers("2.12.0")) == \
        (False, True, True, False)
    assert str(pair.first) == "2.8.0" and pair.covers(Release.parse("2.9.1+cu130")) and str(listed) == "2.3.1, 2.4"
    assert ReleaseRange.parse("2.4") == ReleaseRange.parse(["2.4"]) == ReleaseRange.between("2.4", "2.4")
    for bad in ("2.4.x", "2.8.0..2.7", "2.14.1+cu130", "2.1.0.1", [], "2"):
        with pytest.raises(ValueError):
            ReleaseRange.parse(bad)
    with pytest.raises(ValueError, match="not a series"):
        ReleaseRange.parse(["2.14", "2.14.1"], series=True)


def test_a_macos_version_is_read_in_one_place():
    assert (parse_macos("14.4"), parse_macos("15"), parse_macos(" 26.0 ")) == ((14, 4), (15, 0), (26, 0))
    assert macos_text((14, 4)) == "14.4"
    for bad in ("sonoma", "14.x", "", "-1"):
        with pytest.raises(ValueError, match="not a macOS version"):
            parse_macos(bad)


# --- torchvision.yaml ------------------------------------------------------------------------


def test_torchvision_table():
    table = load_torchvision()
    names = {k.name for k in table}
    assert {"nms", "roi_align", "_roi_align_backward", "roi_pool", "ps_roi_align", "ps_roi_pool",
            "deform_conv2d"} <= names
    assert all(k.namespace == "torchvision" and e.source for k, e in table.items())
    assert table[K("torchvision::nms")].since_torch == "2.1"
    assert table[K("torchvision::deform_conv2d")].since_torchvision == "0.23"


# --- common_mps.py ---------------------------------------------------------------------------


@pytest.mark.skipif(installed_path() is None, reason="the installed torch wheel has no common_mps.py")
def test_common_mps_lists_are_read_without_import():
    lists = load_common_mps(installed_path())
    assert "torch.testing._internal.common_mps" not in sys.modules
    assert {"add", "mm", "cumsum"} <= lists.supported_complex()
    assert lists.unimplemented["take"] is None and lists.unimplemented["median"] == ("bool",)
    if INSTALLED == "2.14.1":  # mps_facts.md §3 table
        assert (len(lists.supported_complex()), len(lists.unimplemented)) == (328, 83)
        assert lists.xfail("MACOS_BEFORE_15_0_XFAILLIST", (14, 0)) == {"matrix_exp": None}
        assert lists.xfail("MACOS_BEFORE_15_0_XFAILLIST", (15, 0)) == {}  # gated: gone from macOS 15.0 on


def test_opinfo_candidates_by_name():
    assert opinfo_candidates("add_")[0] == "add"
    assert "linalg.svd" in opinfo_candidates("linalg_svd")
    assert "nn.functional.conv2d" in opinfo_candidates("conv2d")
    assert "conj" in opinfo_candidates("_conj")
    assert opinfo_candidates("__and__")[0] == "__and__"


# --- size rules (kernel_rules.yaml `size_rules`) ---------------------------------------------


def _size_rule(rule_id: str):
    rule = next(r for r in load_kernel_rules().size_rules if r.id == rule_id)
    return lambda note: size_rule_fires(rule, note)


def test_bad_size_rules_fail_fast():
    with open(RULES_PATH, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    for breakage, message in [
        (lambda r: r["size_rules"][0].update(when="input_spatial.size"), "not allowed"),  # was: a check not named
        (lambda r: r["size_rules"][0].pop("source"), "bad size rule"),
        (lambda r: r["size_rules"][0]["releases"].append("2.14.1"), "not a series"),
    ]:
        broken = yaml.safe_load(yaml.safe_dump(raw))
        breakage(broken)
        with pytest.raises(ValueError, match=message):
            parse_kernel_rules(yaml.safe_dump(broken))


@pytest.mark.parametrize("section", ["rules", "patterns", "size_rules", "fallbacks"])
def test_kernel_rules_keys_are_the_fields_of_their_dataclass(section):
    from opscan.knowledge.schema import entry_keys

    with open(RULES_PATH, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    entry = raw[section][0]
    cls = type(getattr(load_kernel_rules(), section)[0])
    required, allowed = entry_keys(cls)
    assert "code" not in allowed and "first_tensor" not in allowed  # derived on load, never spelled
    assert required <= set(entry) <= allowed
    for broken, message in [({**entry, "sorce": "typo"}, "unknown \\['sorce'\\]"),
                            ({k: v for k, v in entry.items() if k != "when"}, "missing \\['when'\\]"),
                            ({**entry, "code": "x"}, "unknown \\['code'\\]")]:
        with pytest.raises(ValueError, match=message):
            parse_kernel_rules(yaml.safe_dump({section: [broken]}))
    with pytest.raises(ValueError, match="repeated"):
        parse_kernel_rules(yaml.safe_dump({section: [entry, entry]}))


def _via_file(load):
    def parse(raw, tmp_path):
        path = tmp_path / "file.yaml"
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        return load.__wrapped__(str(path))
    return parse


def _knowledge_files():
    from opscan.knowledge import (composite_paths, device_code, expectations, facts, kernel_decisions, py_drift,
                                  silent_bugs)

    here = os.path.dirname(facts.FACTS_PATH)
    text = lambda parse: lambda raw, _: parse(yaml.safe_dump(raw))  # noqa: E731
    plain = lambda parse: lambda raw, _: parse(raw)  # noqa: E731
    return [("kernel_rules.yaml", section, text(parse_kernel_rules))
            for section in ("rules", "patterns", "size_rules", "fallbacks")] + [
        ("composite_paths.yaml", "paths", _via_file(composite_paths.load_composite_paths)),
        ("composite_paths.yaml", "sparse_paths", _via_file(composite_paths.load_composite_paths)),
        ("expectation_conditions.yaml", "conditions", _via_file(expectations.load_conditions)),
        ("silent_bugs.yaml", "entries", text(silent_bugs.parse_bugs)),
        ("torchvision.yaml", "ops", plain(facts.parse_torchvision)),
        ("py_review.yaml", "same_ops", plain(py_drift.parse_py_review)),
        ("device_code.yaml", "device-pick-cpu", plain(device_code.parse_device_table)),
        ("kernel_decisions.yaml", "classes", text(kernel_decisions.parse_decisions)),
    ] + [("facts.yaml", section, plain(parse_facts)) for section in (
        "always_cpu", "error_stubs", "min_macos", "dtype_limits", "earlier_paths", "device_branches",
        "distributed")], here


@pytest.mark.parametrize("case", range(len(_knowledge_files()[0])))
def test_every_knowledge_file_refuses_a_key_its_dataclass_lacks(case, tmp_path):
    files, here = _knowledge_files()
    name, section, parse = files[case]
    with open(os.path.join(here, name), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    parse(raw, tmp_path)  # the shipped file loads
    entry = raw[section] if isinstance(raw[section], dict) else raw[section][0]
    entry["sourse"] = "a misspelt key"  # read as absent before: now refused, naming the file and the key
    with pytest.raises(ValueError, match=rf"{name}: bad .*unknown \['sourse'\]"):
        parse(raw, tmp_path)


def test_adaptive_pool_checks():
    adaptive_pool_divisible = _size_rule("adaptive-avg-pool-divisible")
    adaptive_pool_same_direction = _size_rule("adaptive-pool-direction")
    assert adaptive_pool_divisible({"input_spatial": [7, 7], "output_size": [3, 3]}) is True
    assert adaptive_pool_divisible({"input_spatial": [6, 6], "output_size": [3, 3]}) is False
    assert adaptive_pool_divisible({"input_spatial": [2, 2], "output_size": [4, 6]}) is False
    assert adaptive_pool_divisible({"input_spatial": [2, 2], "output_size": [5, 4]}) is True
    assert adaptive_pool_divisible({"input_spatial": [7, 7]}) is None
    assert adaptive_pool_divisible(None) is None
    assert adaptive_pool_divisible({"input_spatial": [0, 7], "output_size": [3, 3]}) is None  # never a division by 0
    assert adaptive_pool_same_direction({"input_spatial": [7, 3], "output_size": [3, 6]}) is True
    assert adaptive_pool_same_direction({"input_spatial": [7, 7], "output_size": [3, 3]}) is False


def test_note_from_shapes_knows_argument_order():
    fwd = note_from_shapes(K("aten::_adaptive_avg_pool2d"), [(1, 2, 7, 7)], [(1, 2, 3, 3)])
    bwd = note_from_shapes(K("aten::_adaptive_avg_pool2d_backward"), [(1, 2, 3, 3), (1, 2, 7, 7)],
                           [(1, 2, 7, 7)])
    assert fwd == bwd == {"input_spatial": [7, 7], "output_size": [3, 3]}
    assert note_from_shapes(K("aten::add.Tensor"), [(2,)], [(2,)]) is None
    assert note_from_shapes(K("aten::_adaptive_avg_pool2d"), [], []) is None
