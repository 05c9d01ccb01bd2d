"""Crafted target for `opscan accept`: a step whose backward uses an op the target device does not implement.

SIMULATED FAILURE. `opscan_example::gather_bias` is a custom op (a gather of a learned bias table) whose
backward, `opscan_example::scatter_bias`, raises PyTorch's own NotImplementedError text for a missing MPS
kernel — "The operator 'aten::put_' is not currently implemented for the MPS device..." — when its gradient
is on the device, or in the dtype, named by `unsupported_on` (a device type such as "cuda" or "mps", or a
dtype such as "bfloat16"). It stands in for an op PyTorch lacks on a device; no real kernel is missing.
On a CPU-only machine the target is told apart from the reference by its dtype (the reference always runs
float32), so the test runs:

    opscan accept examples/accept_unsupported.py:build_model --device cpu --dtype bfloat16 \\
        --arg unsupported_on=bfloat16

and on a GPU machine `--device cuda --arg unsupported_on=cuda`. The forward of iteration 1 runs; its
backward raises on the target: `opscan accept` compares what came before, names the op and exits 1 (lane
linux-gpu-first). Without `unsupported_on` the model is accepted.
"""

import torch
from torch import nn

MPS_TEXT = ("The operator 'aten::put_' is not currently implemented for the MPS device. If you want this op to "
            "be considered for addition please comment on https://github.com/pytorch/pytorch/issues/141287 and "
            "mention use-case, that resulted in missing op as well as commit hash {}. As a temporary fix, you can "
            "set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this "
            "op. WARNING: this will be slower than running natively on MPS.")
_UNSUPPORTED = {"on": ""}  # set by build_model: the device type or dtype the simulated backward refuses


@torch.library.custom_op("opscan_example::gather_bias", mutates_args=())
def gather_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table.flatten()[index]."""
    return table.reshape(-1)[index]


@torch.library.custom_op("opscan_example::scatter_bias", mutates_args=())
def scatter_bias(grad: torch.Tensor, index: torch.Tensor, numel: int) -> torch.Tensor:
    """gather_bias's backward; SIMULATED: raises PyTorch's MPS text on the device or dtype named unsupported."""
    if _UNSUPPORTED["on"] in (grad.device.type, str(grad.dtype).removeprefix("torch.")):
        raise NotImplementedError(MPS_TEXT.format(torch.__version__))
    flat = torch.zeros(numel, dtype=grad.dtype, device=grad.device)
    return flat.index_add_(0, index.reshape(-1), grad.reshape(-1))


@gather_bias.register_fake
def _(table, index):
    return table.new_empty(index.shape)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.shape = inputs[0].shape


def _backward(ctx, grad):
    (index,) = ctx.saved_tensors
    return scatter_bias(grad, index, ctx.shape.numel()).reshape(ctx.shape), None


gather_bias.register_autograd(_backward, setup_context=_setup)


class Net(nn.Module):
    """Linear, then a bias gathered from a learned table."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.table = nn.Parameter(torch.randn(2, 8))
        self.register_buffer("index", torch.arange(16).reshape(4, 4))

    def forward(self, x):
        return self.fc(x) + gather_bias(self.table, self.index)


def build_model(unsupported_on: str = ""):
    """The net and a batch of 4; `unsupported_on` names where the simulated backward raises ("" nowhere)."""
    _UNSUPPORTED["on"] = unsupported_on
    return Net(), torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
