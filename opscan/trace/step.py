"""Trace stage: run one training step (or one inference forward) the way the contract says.

The step: `train_step(model, optimizer, inputs)` if the target defines it; otherwise forward, the
loss (`loss_fn(outputs, inputs)`, else `outputs.loss`, else the sum of floating outputs), backward,
`optimizer.step()` and `optimizer.zero_grad()`. The optimizer is `build_optimizer(model)` or AdamW.
"""

from __future__ import annotations

from typing import Any

import torch

from opscan.errors import StepError


def call_model(model: torch.nn.Module, inputs: Any):
    """Call the model with inputs given as a tensor, a tuple/list (positional) or a dict (keywords)."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def floating_outputs(value) -> list[torch.Tensor]:
    """Every floating tensor in an output structure (tensors, sequences, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for item in value.values() for t in floating_outputs(item)]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in floating_outputs(item)]
    return []


def default_loss(outputs, inputs, loss_fn=None) -> torch.Tensor:
    """loss_fn(outputs, inputs), else outputs.loss, else the sum of floating outputs."""
    if loss_fn is not None:
        return loss_fn(outputs, inputs)
    loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    tensors = [t for t in floating_outputs(outputs) if t.requires_grad]
    if not tensors:
        raise StepError(
            "the model returned no floating output that requires grad, so there is no loss "
            "— define loss_fn(outputs, inputs) or train_step(model, optimizer, inputs) in the target file"
        )
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


def make_optimizer(model: torch.nn.Module, build_optimizer=None) -> torch.optim.Optimizer:
    """build_optimizer(model), else AdamW with defaults over the trainable parameters."""
    if build_optimizer is not None:
        return build_optimizer(model)
    with torch._C.DisableTorchFunction():  # opscan's own reads, not the step's calls (no mode's job acts on them)
        params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        said = "the model has no trainable parameters, so there is nothing for the default AdamW to train — "
        raise StepError(said + "scan its forward with --inference, or define build_optimizer(model) or "
                               "train_step(model, optimizer, inputs) in the target file",
                        api=said + "scan its forward with inference=True, or pass optimizer= or train_step=")
    return torch.optim.AdamW(params)


def run_train_step(model, optimizer, inputs, train_step=None, loss_fn=None) -> None:
    """One step: the user's train_step, or forward, loss, backward, step, zero_grad."""
    if train_step is not None:
        train_step(model, optimizer, inputs)
        return
    outputs = call_model(model, inputs)
    loss = default_loss(outputs, inputs, loss_fn)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def run_inference(model, inputs) -> None:
    """Forward only, under torch.inference_mode()."""
    with torch.inference_mode():
        call_model(model, inputs)


def cast_floating(value, dtype: torch.dtype):
    """Cast floating tensors in an input structure to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floating(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floating(v, dtype) for v in value)
    return value
