"""Issue 36 (security and hardening, round 4) on its own, unit by unit: the trusted reader's value errors, the
writers' files (O_EXCL|O_NOFOLLOW, no link under -o followed), the recorded command line, the escapers per output
kind, redaction, names, supports(), SARIF, analyze()'s isolation, the zoo journal and families. Each test names
the issue's item it proves; the same promises through `python -m opscan` are tests/test_hostile_round4.py's."""

from __future__ import annotations

import json
import sys

import pytest

from opscan.errors import UsageError
from opscan.trust.read import Malformed, json_value, read_json, read_yaml, yaml_value

LONG_INT = "9" * (sys.get_int_max_str_digits() + 1)


# --- the reader: every error a value can raise ----------------------------------------------------------------


def test_a_json_integer_too_long_for_int_is_malformed_naming_its_field():
    with pytest.raises(Malformed, match=r"ops\[1\]\.calls: an integer of 4301 digits"):
        json_value('{"ops": [{"calls": 1}, {"calls": ' + LONG_INT + "}]}")


@pytest.mark.parametrize("text, field", [
    ('{"a": {"b": NaN}}', "a.b: NaN"), ('{"a": [Infinity]}', r"a\[0\]: Infinity"),
    ('{"x": -Infinity}', "x: -Infinity"), ('{"x": 1e999}', "x: a number too large for a float"),
])
def test_json_that_is_not_strict_json_is_malformed_naming_its_field(text, field):
    with pytest.raises(Malformed, match=field):
        json_value(text)


def test_a_lone_surrogate_in_json_is_malformed_naming_its_field():
    with pytest.raises(Malformed, match=r"model: a lone surrogate"):
        json_value('{"model": "x\\ud800y"}')
    assert json_value('{"model": "\\ud83d\\ude00"}') == {"model": "\U0001f600"}  # a pair is one character


@pytest.mark.parametrize("text, says", [
    ("models:\n  m:\n    added: 2023-02-30\n", r"models\.m\.added \(line 3, column 12\).*day is out of range"),
    ("seed: " + LONG_INT + "\n", r"seed \(line 1, column 7\).*integer"),
    ("seed: [1, " + ":".join(["1"] * 3000) + "]\n", r"seed\[1\] \(line 1"),
])
def test_yaml_values_that_cannot_be_built_are_malformed_naming_their_field(text, says):
    with pytest.raises(Malformed, match=says):
        yaml_value(text)


def test_the_files_readers_say_the_file_and_the_field(tmp_path):
    (tmp_path / "r.json").write_text('{"model": ' + LONG_INT + "}")
    with pytest.raises(UsageError, match=r"the baseline .*r\.json is not an opscan report.json \(model: an integer"):
        read_json(tmp_path / "r.json", "the baseline", "fix", expected="an opscan report.json")
    (tmp_path / "z.yaml").write_text("models:\n  m: {target: 'x.py:f', when: 2021-13-01}\n")
    with pytest.raises(UsageError, match=r"the manifest .*z\.yaml is not valid YAML \(models\.m\.when"):
        read_yaml(tmp_path / "z.yaml", "the manifest", "fix")
