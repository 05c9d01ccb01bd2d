"""Shared test setup: offline Hugging Face, no OPSCAN_* flags (nor COLUMNS, FORCE_COLOR, NO_COLOR) leaking in from
the environment,
and paths to the crafted targets and the examples."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs; nothing is downloaded
# the bundles the tests make are recorded (opscan/bundle/record.py) in a store of this test session, not the user's
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="opscan-test-state-")

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TARGETS = TESTS / "targets"
EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def _no_opscan_env(monkeypatch):
    """Flags come from the test, never from OPSCAN_* variables of the shell that runs pytest."""
    for name in list(os.environ):
        if name.startswith("OPSCAN_") or name in ("COLUMNS", "FORCE_COLOR", "NO_COLOR"):
            monkeypatch.delenv(name)  # the table's width and colours too: each test sets its own


def pytest_unconfigure(config):
    """The session's bundle records go with it."""
    shutil.rmtree(os.environ["XDG_STATE_HOME"], ignore_errors=True)


# `pytest -m quick`: the fast part of the suite (the spine, the knowledge base's rules, the renderers, the report
# schema, the docs and the layering; no model is traced): about a minute, against the full suite's ten (README)
QUICK = frozenset({"test_render.py", "test_schema.py", "test_docs.py", "test_layering.py", "test_knowledge.py",
                   "test_kb_releases.py", "test_classify.py", "test_probe_texts.py", "test_probe_units.py",
                   "test_trust_units.py"})


def pytest_collection_modifyitems(config, items):
    """Mark the tests of the QUICK files `quick`."""
    for item in items:
        if item.path.name in QUICK:
            item.add_marker(pytest.mark.quick)


def pytest_addoption(parser):
    """`pytest --update-golden` rewrites tests/golden/* from the current output instead of comparing."""
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from current output")


@pytest.fixture
def golden(request):
    """golden(name, text): compare text with tests/golden/<name> (or rewrite it with --update-golden)."""

    def check(name: str, text: str) -> None:
        path = TESTS / "golden" / name
        if request.config.getoption("--update-golden"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"{path} is missing: run pytest --update-golden and review the diff"
        assert text == path.read_text(encoding="utf-8"), f"{name} changed (pytest --update-golden to accept)"

    return check
