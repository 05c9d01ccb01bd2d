"""The Python API's examples in README.md and docs/api.md run: their `>>>` blocks as doctests (outputs checked),
every other Python block executed, and a `test_*` function one defines called (the pytest example)."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def tiny_model():
    import torch
    from torch import nn

    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/api.md"])
def test_the_api_examples_run(page):
    found = blocks(REPO / page)
    doctests = [b for b in found if b.lstrip().startswith(">>>")]
    assert doctests if page == "README.md" else len(doctests) >= 3
    globs: dict = {}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    parser = doctest.DocTestParser()
    for i, text in enumerate(doctests):  # one session: each block sees the names the ones before it made
        test = parser.get_doctest(text, globs, f"{page}[{i}]", page, 0)
        runner.run(test, clear_globs=False)
        globs.update(test.globs)
    assert runner.summarize(verbose=False).failed == 0
    for text in (b for b in found if b not in doctests and "opscan." in b):
        model, inputs = tiny_model()
        namespace = {"opscan": __import__("opscan"), "build_model": lambda: model, "example_inputs": lambda: inputs}
        exec(compile(text, page, "exec"), namespace)  # noqa: S102 - the page's own example
        tests = [f for name, f in namespace.items() if name.startswith("test_")]
        assert tests
        for test in tests:
            test()
