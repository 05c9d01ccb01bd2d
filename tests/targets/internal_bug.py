"""Test target: a healthy MLP whose factories stand in for a bug in opscan itself (tests/test_cli_exit3.py).

Each factory returns the model and its inputs, and on the way replaces `opscan.report.Report.to_dict` — opscan's
own code, which the JSON report goes through after the target's code has returned — with a broken one. So the
failure happens in opscan, with none of the target's code running, as a real bug of opscan would:
`raises` makes it raise a plain exception (run_guarded's last resort: traceback, "please report", exit 3);
`aborts` makes it kill the process with SIGABRT (the supervisor's reading of an unannounced end with no stage of
the target running: the stacks, "please report", exit 3).
"""

import os

import torch
from torch import nn

import opscan.report

BUG = "simulated bug inside opscan (tests/targets/internal_bug.py replaced Report.to_dict)"


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4)


def _raise(self):
    raise RuntimeError(BUG)


def _abort(self):
    os.abort()


def raises():
    """The model; Report.to_dict now raises RuntimeError."""
    opscan.report.Report.to_dict = _raise
    return _model()


def aborts():
    """The model; Report.to_dict now aborts the process."""
    opscan.report.Report.to_dict = _abort
    return _model()
