"""Accept stage (run): one device's real run — N training iterations and an evaluation pass.

The model is built ONCE on the CPU (torch.manual_seed(seed) first); each device gets a deep copy of
that model (every parameter and buffer, persistent or not), moved there and — on the target with
`--dtype` — cast. Dropout is disabled on both (hooks.py). Each iteration runs the default step of
opscan/trace/step.py (forward, loss, backward, optimizer step, zero_grad) or the target's own
`train_step`, inside the placement recorder's phases; what is compared is copied to the CPU as it is
made: parameters and buffers before the first step (iteration 0), outputs and loss of every forward,
every gradient after the first backward (in the order backward produced them), parameters and
buffers after each step, the evaluation outputs (model.eval(), no_grad) after the last one.
"""

from __future__ import annotations

import copy
import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from opscan.accept.hooks import ModuleOutputs, NoDropout, disable_dropout_modules
from opscan.errors import OpscanError, UsageError
from opscan.probe.texts import NOT_IMPLEMENTED
from opscan.trace.guard import _raised_by_opscan as raised_by_opscan  # the same rule as user_step's
from opscan.trace import step


@dataclass(frozen=True)
class Captured:
    """One compared tensor of one device's run, on the CPU."""

    iteration: int
    kind: str
    name: str
    module: str
    tensor: torch.Tensor


@dataclass
class Session:
    """The live objects of one device's run (the checkpoint round trip continues them)."""

    device: str
    dtype: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    inputs: Any
    target: Any
    dropout_modules: int = 0
    call: tuple | None = None  # (args, kwargs) the target's train_step called the model with: eval reuses them


@dataclass(frozen=True)
class DeviceRun:
    """What one device's run produced: the captured tensors, module outputs, placement, notes."""

    device: str
    dtype: str
    captured: tuple[Captured, ...]
    module_outputs: dict[Any, dict[str, torch.Tensor]]
    activation_bytes: int
    placement: Any
    dropout: dict[str, int]
    notes: tuple[str, ...] = field(default_factory=tuple)
    checkpoint: Any = ()  # what `after` returned: the round trip's Continued records
    failure: str = ""  # the exception that stopped the run (catch=True): "NotImplementedError: ..." and where


def prepare(target, device: str, dtype: str, cpu_model: torch.nn.Module | None = None,
            perturb: tuple[str, float] | None = None) -> Session:
    """A copy of the CPU-built model (or of `cpu_model`) on `device` in `dtype`, with its optimizer."""
    model = copy.deepcopy(cpu_model if cpu_model is not None else target.model).to(device)
    torch_dtype = getattr(torch, dtype)
    if torch_dtype != torch.float32:
        model = model.to(torch_dtype)
    if perturb is not None:
        add_to_parameter(model, *perturb)
    dropout = disable_dropout_modules(model)
    inputs = _to_device(target.inputs, device, torch_dtype)
    optimizer = step.make_optimizer(model, target.build_optimizer)
    return Session(device, dtype, model, optimizer, inputs, target, dropout)


def add_to_parameter(model: torch.nn.Module, name: str, eps: float) -> None:
    """The --perturb self-test: add eps to every element of one parameter (the target's copy only)."""
    params = dict(model.named_parameters())
    if name not in params:
        some = ", ".join(list(params)[:3])
        raise UsageError(f"--perturb {name}: the model has no parameter of that name — name one of its "
                         f"parameters (e.g. {some})")
    with torch.no_grad():
        params[name].add_(eps)


def run_device(session: Session, iterations: int, seed: int, recorder, after=None, catch: bool = False) -> DeviceRun:
    """Run `iterations` training iterations and the evaluation pass on the session's device; then
    `after(session)` (the checkpoint round trip) in the recorder's `checkpoint` phase.

    catch: an exception of the model or torch (not opscan's own, not bad input) stops the run and is
    returned as `failure`, with what was captured and recorded up to that point (the target run: an op
    the device does not implement is the finding, not a usage error)."""
    torch.manual_seed(seed)
    checkpoint, failure = (), ""
    captured: list[Captured] = list(state_tensors(session.model, 0, "initial"))
    no_dropout = NoDropout()
    with recorder, no_dropout, ModuleOutputs(session.model) as outputs:
        try:
            checkpoint = _iterations(session, iterations, recorder, outputs, captured, after)
        except Exception as exc:  # noqa: BLE001 - filtered: only the model's and torch's failures are kept
            if not catch or isinstance(exc, OpscanError) or raised_by_opscan(exc):
                raise
            failure = describe_failure(exc, session.device, getattr(recorder, "failed_in", None))
    placement = recorder.result()
    return DeviceRun(session.device, session.dtype, tuple(captured), outputs.by_forward,
                     outputs.activation_bytes.get(1, 0), placement,
                     {"modules": session.dropout_modules, "functional_calls": no_dropout.changed},
                     ("module outputs beyond the budget were not kept",) if outputs.truncated else (),
                     checkpoint, failure)


def _iterations(session: Session, iterations: int, recorder, outputs, captured: list[Captured], after):
    """The iterations, the evaluation and `after`, appending to `captured` as each tensor is made."""
    for iteration in range(1, iterations + 1):
        outputs.forward(iteration)
        train_iteration(session, iteration, recorder, gradients=iteration == 1, found=captured)
    outputs.forward("eval")
    captured += evaluate(session, iterations, recorder)
    outputs.forward(None)
    if after is None:
        return ()
    with recorder.phase("checkpoint", iterations):
        return after(session)


def describe_failure(exc: BaseException, device: str, where: tuple[str, int] | None) -> str:
    """'the step fails on mps:0 in iteration 1, backward: aten::put_ is not implemented there — Type: line'."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    unsupported = NOT_IMPLEMENTED.search(first)
    op = f"{unsupported.group('op')} is not implemented there — " if unsupported else ""
    first = first[:unsupported.end()] + "." if unsupported else first  # PyTorch's first sentence
    at = "" if where is None else f" in iteration {where[1]}, {where[0]}" if where[1] else f" while {where[0]}"
    return f"the step fails on {device}{at}: {op}{type(exc).__name__}: {first}"


def train_iteration(session: Session, iteration: int, recorder, gradients: bool,
                    found: list[Captured] | None = None) -> list[Captured]:
    """One step; captures output, loss, (gradients,) parameters and buffers after it, appended to `found`
    (a new list unless given) as they are made, so a step that raises keeps what came before."""
    target, model, optimizer = session.target, session.model, session.optimizer
    found = [] if found is None else found
    if target.train_step is not None:
        return _user_step(session, iteration, recorder, gradients, found)
    with recorder.phase("forward", iteration):
        outputs = step.call_model(model, session.inputs)
    with recorder.phase("loss", iteration):
        loss = step.default_loss(outputs, session.inputs, target.loss_fn)
    found += [*named_outputs(outputs, iteration, "output"), _loss(loss, iteration)]
    with _grad_order(model) if gradients else contextlib.nullcontext([]) as order:
        with recorder.phase("backward", iteration):
            loss.backward()
    if gradients:
        found += gradient_tensors(model, iteration, order)
    with recorder.phase("optimizer", iteration):
        optimizer.step()
        optimizer.zero_grad()
    if iteration == 1:
        recorder.census(model, optimizer, session.inputs, loss)
    found += state_tensors(model, iteration, "parameter")
    return found


def _user_step(session: Session, iteration: int, recorder, gradients: bool, found: list[Captured]) -> list[Captured]:
    """The target's own train_step: outputs from the model's forward hook, gradients before the step."""
    model, optimizer = session.model, session.optimizer
    seen = {"first": True}

    def keep_output(_module, args, kwargs, output):
        if seen.pop("first", False):
            found.extend(named_outputs(output, iteration, "output"))
            session.call = session.call or (args, kwargs)

    def keep_gradients(*_):
        if gradients and not any(c.kind == "gradient" and c.iteration == iteration for c in found):
            found.extend(gradient_tensors(model, iteration, []))

    handles = [model.register_forward_hook(keep_output, with_kwargs=True),
               optimizer.register_step_pre_hook(keep_gradients)]
    try:
        with recorder.phase("step", iteration):
            result = session.target.train_step(model, optimizer, session.inputs)
    finally:
        for handle in handles:
            handle.remove()
    if isinstance(result, torch.Tensor) and result.is_floating_point():
        found.append(_loss(result, iteration))
    if iteration == 1:
        recorder.census(model, optimizer, session.inputs, result if isinstance(result, torch.Tensor) else None)
    found += state_tensors(model, iteration, "parameter")
    return found


def evaluate(session: Session, iteration: int, recorder) -> list[Captured]:
    """model.eval() and no_grad on the fixed batch; the model is put back in training mode after."""
    session.model.eval()
    try:
        with recorder.phase("eval", iteration), torch.no_grad():
            if session.call is not None:  # the model as the target's train_step calls it
                outputs = session.model(*session.call[0], **session.call[1])
            else:
                outputs = step.call_model(session.model, session.inputs)
    finally:
        session.model.train()
    return named_outputs(outputs, iteration, "eval")


def state_tensors(model: torch.nn.Module, iteration: int, kind: str) -> list[Captured]:
    """Every parameter (kind) and every buffer (kind `buffer`, or `initial`/`reload` for both)."""
    params = [Captured(iteration, kind, n, owner(n), _cpu(p)) for n, p in model.named_parameters()]
    buffer_kind = "buffer" if kind == "parameter" else kind
    buffers = [Captured(iteration, buffer_kind, n, owner(n), _cpu(b)) for n, b in model.named_buffers()]
    return params + buffers


def gradient_tensors(model: torch.nn.Module, iteration: int, order: list[str]) -> list[Captured]:
    """Every parameter's gradient, in the order backward produced them (then the rest by name)."""
    params = dict(model.named_parameters())
    names = [n for n in order if n in params] + [n for n in params if n not in order]
    return [Captured(iteration, "gradient", n, owner(n), _cpu(params[n].grad)) for n in names
            if params[n].grad is not None]


def named_outputs(value, iteration: int, kind: str, prefix: str = "output") -> list[Captured]:
    """The floating tensors of an output structure, named by their path (output.logits, output[0])."""
    if isinstance(value, torch.Tensor):
        return [Captured(iteration, kind, prefix, "", _cpu(value))] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [c for k, v in value.items() for c in named_outputs(v, iteration, kind, f"{prefix}.{k}")]
    if isinstance(value, (tuple, list)):
        return [c for i, v in enumerate(value) for c in named_outputs(v, iteration, kind, f"{prefix}[{i}]")]
    return []


def owner(name: str) -> str:
    """The module path that owns a parameter or buffer name ('(model)' for the root)."""
    return name.rpartition(".")[0] or "(model)"


def _loss(loss: torch.Tensor, iteration: int) -> Captured:
    return Captured(iteration, "loss", "loss", "(loss)", _cpu(loss))


@contextlib.contextmanager
def _grad_order(model: torch.nn.Module):
    """The names of parameters in the order backward accumulated their gradients."""
    order: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: order.append(n))
               for n, p in model.named_parameters() if p.requires_grad]
    try:
        yield order
    finally:
        for handle in handles:
            handle.remove()


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _to_device(value, device: str, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        return value.to(dtype) if value.is_floating_point() and dtype != torch.float32 else value
    if isinstance(value, dict):
        return {k: _to_device(v, device, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device, dtype) for v in value)
    return value
