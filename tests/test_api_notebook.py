"""opscan.analyze as a notebook user meets it (issue 35): the `where` of a model defined in a cell is `Cell In[n], line
k` (IPython's own words), the report's repr is one line, errors name the API's arguments (no command-line flags),
Python's `random` state is the same after the first analyze() of a fresh process, and a forward hook of the model
runs on the copies (documented in docs/api.md: it is part of the model) — never with the caller's module.

IPython is not a test dependency: `ipython_cell` stands in for it exactly where opscan reads it (its
`get_ipython().compile._filename_map`, filename -> execution count, which IPython's tracebacks read for `Cell In[n]`,
and the cell's source in linecache under that filename, as IPython's CachingCompiler puts it)."""

from __future__ import annotations

import linecache
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.nn as nn

import opscan
from opscan.errors import StepError
from opscan.render import render_html, render_table

CELL = "/tmp/ipykernel_4242/2847561.py"  # the name ipykernel compiles a cell under
SOURCE = """import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.lin(x).double().sum()
"""


@pytest.fixture
def ipython_cell(monkeypatch):
    """The class Net defined in cell 7 of a (stand-in) IPython session."""
    monkeypatch.setitem(linecache.cache, CELL, (len(SOURCE), None, SOURCE.splitlines(True), CELL))
    module = types.ModuleType("IPython")
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(_filename_map={CELL: 7}))
    module.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", module)
    namespace: dict = {}
    exec(compile(SOURCE, CELL, "exec"), namespace)  # noqa: S102 - the test's own cell
    return namespace["Net"]


def test_the_where_of_a_model_defined_in_a_cell_is_the_cell(ipython_cell):
    report = opscan.analyze(ipython_cell(), torch.randn(2, 4), memory=False)
    (finding, *_) = report.findings
    assert finding.site["cell"] == 7 and finding.site["line"] == 7 and finding.site["function"] == "Net.forward"
    assert finding.site["text"] == "return self.lin(x).double().sum()"
    table = render_table(report, width=100)
    assert "[1] Cell In[7], line 7 in Net.forward: unsupported_dtype (predicted)" in table
    assert "/tmp/ipykernel_4242" not in table
    assert "Cell In[7], line 7 in Net.forward" in render_html(report)
    row = next(r for r in report.ops if r.where)
    assert row.where[0]["cell"] == 7 and report.to_dict()["ops"][report.ops.index(row)]["where"][0]["cell"] == 7


def test_the_report_repr_is_one_line():
    report = opscan.analyze(nn.Linear(4, 2), torch.randn(3, 4), memory=False)
    text = repr(report)
    assert text == ("<NotebookReport opscan.analyze(Linear): predicted for torch "
                    f"{report.assumptions['torch_release']}, lane mac-first, 0 findings (0 of {len(report.ops)} rows "
                    "not native)>")


class NoParams(nn.Module):
    def forward(self, x):
        return x * 2


def test_errors_name_the_apis_arguments_not_command_line_flags():
    with pytest.raises(StepError) as failed:
        opscan.analyze(nn.Linear(4, 2), torch.randn(3, 5), memory=False)
    said = str(failed.value)
    assert "example_inputs" in said and "--input" not in said and "-v" not in said.split()
    assert failed.value.user_traceback  # the user's frames, which the message points at
    with pytest.raises(StepError, match=r"inference=True, or pass optimizer= or train_step=") as failed:
        opscan.analyze(NoParams(), torch.randn(3, 4), memory=False)
    assert "--" not in str(failed.value)
    if not torch.backends.mps.is_available():
        from opscan.probe.stage import ProbeEnvironmentError

        with pytest.raises(ProbeEnvironmentError, match=r'pass device="cpu" or "cuda"') as failed:
            opscan.analyze(nn.Linear(4, 2), torch.randn(3, 4), memory=False, device="mps")
        assert "--" not in str(failed.value)


def test_a_forward_hook_runs_on_the_copy_never_with_the_callers_module():
    # documented (docs/api.md): hooks are part of the model (weight_norm, pruning and accelerate's run as hooks),
    # so the step runs them; they run on the copy, and what they close over is theirs to keep
    model, seen = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), []
    model[0].register_forward_hook(lambda module, args, out: seen.append(module))
    opscan.analyze(model, torch.randn(3, 4), memory=False)
    assert seen and all(module is not model[0] for module in seen)
    assert all(isinstance(module, nn.Linear) for module in seen)


def test_the_first_analyze_of_a_fresh_process_keeps_pythons_random_state():
    code = textwrap.dedent("""
        import random, torch, opscan
        random.seed(1234)
        before = random.getstate()
        opscan.analyze(torch.nn.Linear(4, 2), torch.randn(3, 4), memory=False)
        after = random.getstate()
        print("same" if before == after else "changed")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "same"
