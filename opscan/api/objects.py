"""API: `analyze(model, example_inputs, ...)`, the scan of objects in memory (a notebook's model).

The same stages as `opscan TARGET`: the knowledge base of the release asked for, the step traced as MPS would
dispatch it, the MPS view, the predictions (and with `device`, the probes, in their own worker processes), the
step graph, the lane, the memory estimate — only the target is built from the objects given instead of importing
a spec, and the step runs on copies of them in this process (api/isolation.py). Nothing is written.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from opscan.errors import OpscanError, TargetError

if TYPE_CHECKING:
    from opscan.render.notebook import NotebookReport


def analyze(model: Any, example_inputs: Any, *, optimizer: Any = None, loss_fn: Callable | None = None,
            train_step: Callable | None = None, inference: bool = False, torch_version: str | None = None,
            macos: str | None = None, dtype: str | None = None, device: str | None = None, memory: bool = True,
            fx: bool = True, name: str | None = None) -> NotebookReport:
    """Scan one training step (or, with `inference=True`, one forward) of `model` on `example_inputs` for MPS.

    `example_inputs`: a tensor, a tuple/list (positional) or a dict (keywords), as the model takes them.
    The step, as the CLI's: `train_step(model, optimizer, inputs)` when given; else forward, `loss_fn(outputs,
    inputs)` (else `outputs.loss`, else the sum of the floating outputs), backward, `optimizer.step()` and
    `zero_grad()`, with `optimizer` (else AdamW over the trainable parameters).
    `torch_version`/`macos`: predict for that release and macOS (default: the installed torch, its minimum macOS).
    `dtype`: cast the model and floating inputs first ("bfloat16", ...). `device`: measure every distinct call
    on that device ("mps", "cpu", "cuda") in probe worker processes (default: predicted only). `memory`: the
    memory estimate and Mac sizing. `fx`: tag calls with fx nodes. `name`: the report's model name.

    Runs on deep copies: the caller's model, inputs, optimizer, loss_fn and train_step are left as they were
    (api/isolation.py; an IsolationError says when a hook reached past the copies). Raises TargetError or
    StepError (opscan.errors) with one line saying what to fix."""
    from opscan.api.isolation import kept_random_state

    # the random states are kept from here: the first analyze() of a process imports opscan's stages (and what they
    # import may draw from Python's `random` or seed it), and those imports happen inside
    with kept_random_state():
        try:
            return _analyzed(model, example_inputs, optimizer, loss_fn, train_step, inference,
                             _options(model, inference, torch_version, macos, dtype, device, memory, fx), name)
        except OpscanError as exc:  # in the API's words: no command-line flags in what a notebook shows
            if exc.api is None:
                raise
            raise exc.for_api() from None


def _analyzed(model, example_inputs, optimizer, loss_fn, train_step, inference: bool, options, name):
    """analyze() inside its kept random state."""
    from opscan.api.isolation import Fingerprint, check_apart, check_unchanged, copies_of, optimizer_for
    from opscan.knowledge import load_knowledge
    from opscan.render.notebook import NotebookReport
    from opscan.scan import prepare_loaded, scan
    from opscan.target.load import Target
    from opscan.target.run import RunContext
    from opscan.target.user_code import project_folder

    _check(model, optimizer, loss_fn, train_step, inference)
    kb = load_knowledge(release=options.torch_version, macos=options.macos)  # an unknown release fails first
    ctx = RunContext()
    fingerprint = Fingerprint(model, optimizer, (loss_fn, getattr(train_step, "__self__", None)))
    copies = copies_of(model, example_inputs, optimizer, loss_fn, train_step)
    check_apart(model, optimizer, copies)  # a copy that is not one: refused before the step touches anything
    target = Target(spec=options.target, name=name or type(model).__name__, model=copies.model,
                    inputs=copies.inputs, train_step=copies.train_step, loss_fn=copies.loss_fn,
                    build_optimizer=optimizer_for(copies), project=project_folder(os.path.join(os.getcwd(), "_")))
    report = scan(options, prepared=prepare_loaded(target, options, kb, ctx), ctx=ctx)
    check_unchanged(fingerprint)
    return NotebookReport.of(report)


def _check(model, optimizer, loss_fn, train_step, inference: bool) -> None:
    """TargetError for arguments of the wrong kind (one line each)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"opscan.analyze needs an nn.Module, got {type(model).__name__} — pass the model object")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TargetError(f"optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer — pass the "
                          "optimizer built over this model's parameters, or None for AdamW")
    for label, value in (("loss_fn", loss_fn), ("train_step", train_step)):
        if value is not None and not callable(value):
            raise TargetError(f"{label} is a {type(value).__name__}, not callable — pass a function or None")
    if inference and (optimizer is not None or train_step is not None):
        raise TargetError("inference=True scans the forward only — drop optimizer and train_step, or scan the "
                          "training step with inference=False")


def _options(model, inference, torch_version, macos, dtype, device, memory, fx):
    from opscan.scan import ScanOptions

    probe = None
    if device is not None:
        from opscan.probe.stage import ProbeOptions

        probe = ProbeOptions(device=device)
    return ScanOptions(target=f"opscan.analyze({type(model).__name__})", inference=inference, dtype=dtype, fx=fx,
                       torch_version=torch_version, macos=macos, probe=probe, memory=memory)
