"""`opscan accept`, where things ran: transfers, fallbacks, the device census, memory per phase, the measured lane.

Real runs on the CPU: examples/accept_cpu_layer.py (a head kept on the CPU: its `.cpu()` is reported with
hand-computed bytes and its module, and the lane is not mac-first) and torchvision's resnet18 (everything on
the CPU, no transfer, mac-first). The MPS fallback is a SIMULATED test double: custom ops on the CPU that
emit exactly PyTorch's fallback warning, once per process unless warn-always is on, as MPSFallback.mm does (one
TORCH_WARN_ONCE call site for every op: the first op to fall back warns, later ones — other ops too — are silent;
tests/simulated_mps behaves the same).
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from opscan.accept.lane import fallback_bytes_per_iteration, measured_lane
from opscan.accept.placement import FallbackUse, Placement, PlacementRecorder, Transfer
from opscan.target.load import load_target
from opscan.trace import step
from tests.conftest import EXAMPLES

FALLBACK_TEXT = ("The operator '{}' is not currently supported on the MPS backend and will fall back to run on "
                 "the CPU. This may have performance implications. (Triggered internally at "
                 "/Users/runner/work/pytorch/aten/src/ATen/mps/MPSFallback.mm:14.)")
_ONCE = {"warned": False}  # the double's TORCH_WARN_ONCE state: one flag per process, whatever the op


def _simulated_fallback(op: str) -> None:
    """SIMULATED: PyTorch's fallback warning, once per process (naming the first op that fell back) unless
    torch.set_warn_always(True)."""
    if torch.is_warn_always_enabled() or not _ONCE["warned"]:
        _ONCE["warned"] = True
        warnings.warn(FALLBACK_TEXT.format(op), UserWarning, stacklevel=2)


@torch.library.custom_op("opscan_sim::take", mutates_args=())
def sim_take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """SIMULATED aten::take falling back to the CPU: warns as MPS would, then gathers."""
    _simulated_fallback("aten::take")
    return table.reshape(-1)[index]


@torch.library.custom_op("opscan_sim::put", mutates_args=())
def sim_put(grad: torch.Tensor, index: torch.Tensor, numel: int) -> torch.Tensor:
    """SIMULATED aten::put_ (take's backward) falling back to the CPU."""
    _simulated_fallback("aten::put_")
    return torch.zeros(numel, dtype=grad.dtype, device=grad.device).index_add_(0, index.reshape(-1), grad.reshape(-1))


@sim_take.register_fake
def _(table, index):
    return table.new_empty(index.shape)


def _take_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.shape = inputs[0].shape


def _take_backward(ctx, grad):
    (index,) = ctx.saved_tensors
    return sim_put(grad, index, ctx.shape.numel()).reshape(ctx.shape), None


sim_take.register_autograd(_take_backward, setup_context=_take_setup)


class BiasTable(nn.Module):
    """A learned table gathered through the simulated fallback op."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(2, 7))
        self.register_buffer("index", torch.arange(12).reshape(3, 4))

    def forward(self, x):
        return x + sim_take(self.table, self.index)


class FallbackNet(nn.Module):
    """A linear layer, then the bias gathered by the simulated fallback op."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.bias = BiasTable()

    def forward(self, x):
        warnings.warn("an unrelated warning of the model", UserWarning)
        return self.bias(self.proj(x))


class ScalarReadNet(nn.Module):
    """Reads one value of its activations into Python in forward (a sync on an accelerator, not a bulk move)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        return y * 2 if y.sum().item() > 0 else y


def _run(model, inputs, device="cpu", iterations=2, loss_fn=None) -> Placement:
    """The engine's loop in small: phases per iteration, the census after the first step."""
    optimizer = torch.optim.AdamW(model.parameters())
    with PlacementRecorder(model, device) as recorder:
        for iteration in range(1, iterations + 1):
            with recorder.phase("forward", iteration):
                outputs = step.call_model(model, inputs)
            with recorder.phase("loss", iteration):
                loss = step.default_loss(outputs, inputs, loss_fn)
            with recorder.phase("backward", iteration):
                loss.backward()
            with recorder.phase("optimizer", iteration):
                optimizer.step()
                optimizer.zero_grad()
            if iteration == 1:
                recorder.census(model, optimizer, inputs, loss)
    return recorder.result()


def test_cpu_layer_move_is_reported_with_bytes_and_module_and_is_not_mac_first():
    target = load_target(f"{EXAMPLES / 'accept_cpu_layer.py'}:build_model", {}, [])
    placement = _run(target.model, target.inputs, iterations=2, loss_fn=target.loss_fn)
    moves = [t for t in placement.transfers if t.op == "cpu()"]
    # the head's input, batch 8 x 16 features float32 = 8 * 16 * 4 = 512 bytes, once per iteration, 2 iterations
    assert moves == [Transfer("cpu()", "cpu", "cpu", 1024, "head", "forward", 2)]
    assert not moves[0].moved_here  # requested on the CPU: nothing crossed here
    assert moves[0].to_dict()["kind"] == "copy"
    lane = measured_lane((), placement, step_bytes=10**6)
    assert lane.name == "dual-track"
    assert lane.reasons[0].startswith("head asks for cpu() of 512 B per iteration (2 calls in 2 iterations) in forward")
    assert lane.reasons[-1].startswith("measured on cpu, not on a Mac")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_layer_on_a_gpu_moves_both_ways_and_leaves_the_head_on_the_host():
    target = load_target(f"{EXAMPLES / 'accept_cpu_layer.py'}:build_model", {}, [])
    model, inputs = target.model.to("cuda"), target.inputs.to("cuda")
    placement = _run(model, inputs, device="cuda", iterations=2, loss_fn=target.loss_fn)
    assert set(placement.transfers) == {  # 2 iterations; features 8 x 16 float32 = 512 B, logits 8 x 4 = 128 B
        Transfer("cpu()", "cuda:0", "cpu", 2 * 512, "head", "forward", 2),
        Transfer("to()", "cpu", "cuda:0", 2 * 128, "head", "forward", 2),  # the logits back to the GPU
        Transfer("to()", "cpu", "cuda:0", 2 * 64, "", "loss", 2),  # the labels: 8 int64
        Transfer("aten::_to_copy", "cuda:0", "cpu", 2 * 128, "head", "backward", 2),  # the logits' gradient
        Transfer("aten::_to_copy", "cpu", "cuda:0", 2 * 512, "head", "backward", 2)}  # the features' gradient
    assert placement.devices["parameters"] == {"cuda:0": 4, "cpu": 2}
    assert [m["name"] for m in placement.misplaced][:2] == ["head.proj.weight", "head.proj.bias"]
    lane = measured_lane((), placement, step_bytes=10**6)
    assert lane.name == "dual-track"
    assert lane.reasons[0] == ("head moves 512 B per iteration (2 calls in 2 iterations) from cuda:0 to the host "
                               "with cpu() in forward")


def test_resnet18_runs_entirely_on_the_cpu_and_is_mac_first():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    targets = torch.tensor([1, 2])
    placement = _run(model, torch.randn(2, 3, 32, 32), loss_fn=lambda out, _: nn.functional.cross_entropy(out, targets))
    devices = placement.devices
    assert devices["parameters"] == {"cpu": 62}  # 20 convolutions, 20 batch norms x 2, fc x 2
    assert devices["buffers"] == {"cpu": 60}  # 20 batch norms x (mean, var, num_batches_tracked)
    assert devices["optimizer_state"] == {"cpu": 3 * 62}  # AdamW: step, exp_avg, exp_avg_sq per parameter
    assert devices["optimizer_scalars"] == {"cpu": 62}  # the step counters, kept on the host by PyTorch
    assert devices["inputs"] == {"cpu": 1} and devices["loss"] == {"cpu": 1}
    assert placement.transfers == ()  # AdamW's own step.item() is host work, not a transfer
    assert placement.fallbacks == () and placement.misplaced == ()
    assert measured_lane((), placement, step_bytes=10**8).reasons[0] == (
        "ran entirely on cpu, 2 iterations, within tolerance")
    phases = [(m["iteration"], m["phase"]) for m in placement.memory]
    assert phases == [(i, p) for i in (1, 2) for p in ("forward", "loss", "backward", "optimizer")]
    assert all(m["device"] == "cpu" and m["rss_bytes"] > 0 and m["tensor_bytes"] > 0 for m in placement.memory)
    # after the first optimizer step AdamW's two moments exist: at least twice the parameters' 4-byte floats
    params = sum(p.numel() for p in model.parameters()) * 4
    assert placement.memory[3]["tensor_bytes"] >= 3 * params


def test_the_simulated_fallback_warning_is_warn_once_per_process(recwarn):
    # as MPSFallback.mm's TORCH_WARN_ONCE (one call site for every op) and tests/simulated_mps: a second op that
    # falls back is silent too, until warn-always is on
    previous, state = torch.is_warn_always_enabled(), dict(_ONCE)
    try:
        torch.set_warn_always(False)
        _ONCE["warned"] = False  # a fresh process
        for op in ("aten::take", "aten::put_", "aten::take"):
            _simulated_fallback(op)
        assert [str(w.message) for w in recwarn] == [FALLBACK_TEXT.format("aten::take")]
        torch.set_warn_always(True)
        _simulated_fallback("aten::put_")
        assert [str(w.message) for w in recwarn][1:] == [FALLBACK_TEXT.format("aten::put_")]
    finally:
        torch.set_warn_always(previous)
        _ONCE.update(state)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_simulated_fallbacks_are_counted_per_op_module_and_phase(device):
    torch.manual_seed(0)
    model, x = FallbackNet().to(device), torch.randn(3, 4, device=device)
    _ONCE["warned"] = True  # warn-once: the process has warned before the run (for whatever op)
    with pytest.warns(UserWarning, match="an unrelated warning") as others:
        placement = _run(model, x, iterations=3, device=device)
    assert not torch.is_warn_always_enabled()  # restored
    assert len([w for w in others if "unrelated" in str(w.message)]) == 1  # emitted again, once
    uses = {f.op: f for f in placement.fallbacks}
    assert set(uses) == {"aten::take", "aten::put_"}
    take, put = uses["aten::take"], uses["aten::put_"]
    assert (take.count, take.modules, take.phases) == (3, ("bias",), ("forward",))
    assert (put.count, put.modules, put.phases) == (3, ("bias",), ("backward",))
    assert take.evidence.startswith("PyTorch warned: The operator 'aten::take' is not currently supported")
    # on a device, each call copies its tensors to the host and its result back: take reads the table
    # (2 x 7 float32 = 56 B) and the index (12 int64 = 96 B) and returns 12 float32 (48 B): 200 B per call;
    # put reads the gradient (48 B) and the index (96 B) and returns 14 float32 (56 B): 200 B. On the CPU: 0.
    per_call = 200 if device == "cuda" else 0
    assert (take.bytes, put.bytes) == (3 * per_call, 3 * per_call)
    lane = measured_lane((), placement, step_bytes=10**6)
    assert lane.name == "dual-track"
    assert lane.reasons[0].startswith(f"aten::take fell back to the CPU 3× in forward (bias), copying {3 * per_call} B")


def test_a_scalar_read_is_a_sync_not_a_move():
    torch.manual_seed(0)
    placement = _run(ScalarReadNet(), torch.randn(3, 4))
    (read,) = placement.transfers
    assert (read.op, read.module, read.phase, read.count, read.bytes) == ("item()", "(model)", "forward", 2, 8)
    assert read.to_dict()["kind"] == "sync_read"
    assert measured_lane((), placement, step_bytes=1).name == "mac-first"


class _PassThrough(TorchFunctionMode):
    """Another mode entered after the recorder (as the engine's NoDropout is)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_requests_are_the_models_through_other_modes_and_opscans_own_copies_do_not_count():
    from opscan.accept.run import named_outputs

    torch.manual_seed(0)
    model, x = ScalarReadNet(), torch.randn(3, 4)
    with PlacementRecorder(model, "cpu") as recorder, _PassThrough():
        with recorder.phase("forward", 1):
            out = model(x)
            named_outputs(out, 1, "output")  # the engine's capture: out.detach().to("cpu", copy=True) in opscan
    (read,) = recorder.result().transfers
    assert (read.op, read.module, read.count) == ("item()", "(model)", 1)


def test_a_whole_train_step_is_split_into_its_phases():
    target = load_target(f"{EXAMPLES / 'accept_cpu_layer.py'}:build_model", {}, [])
    model, optimizer = target.model, torch.optim.SGD(target.model.parameters(), lr=0.1)
    with PlacementRecorder(model, "cpu") as recorder:
        with recorder.phase("step", 1):
            loss = target.loss_fn(model(target.inputs), target.inputs)
            print(loss, file=io.StringIO())  # printing the loss: a host read of 4 bytes in the loss phase
            loss.backward()
            optimizer.step()
    placement = recorder.result()
    assert {(t.op, t.module, t.phase, t.bytes) for t in placement.transfers} == {
        ("cpu()", "head", "forward", 512), ("print", "", "loss", 4)}
    assert [(m["iteration"], m["phase"]) for m in placement.memory] == [(1, "step")]
    assert placement.iterations == 1


def _placement(**changes) -> Placement:
    memory = tuple({"iteration": i, "phase": "forward", "device": "mps:0"} for i in (1, 2))
    return Placement(**{"devices": {}, "transfers": (), "fallbacks": (), "memory": memory, "device": "mps:0",
                        **changes})


def test_failures_make_the_lane_linux_gpu_first_with_their_lines():
    failures = ("first divergence: iteration 1 output in layer2.0.conv1 (rel 3.1e-02 > 1e-03)",
                "round trip: reloaded fc.weight differs from the saved one")
    lane = measured_lane(failures, _placement(), step_bytes=1000)
    assert lane.name == "linux-gpu-first"
    assert lane.reasons == (*failures, "measured on mps:0")


def test_a_fallback_that_copies_more_than_the_step_is_linux_gpu_first():
    heavy = FallbackUse("aten::take", 4, ("attn",), ("forward",), "PyTorch warned: ...", bytes=5000,
                        phase_bytes={"forward": 5000})
    lane = measured_lane((), _placement(fallbacks=(heavy,)), step_bytes=2000)
    assert lane.name == "linux-gpu-first"  # 5000 B over 2 iterations = 2500 B per iteration > 2000 B
    assert lane.reasons[0] == ("the CPU fallback copied 2.4 KB per iteration, more than the step's parameters "
                               "and activations together (2.0 KB)")
    assert measured_lane((), _placement(fallbacks=(heavy,)), step_bytes=3000).name == "dual-track"


def test_fallback_bytes_in_eval_and_checkpoint_do_not_count_per_iteration():
    # 2 training iterations: 1000 B in forward, 800 B in backward; eval 3000 B, the round trip's steps 6000 B
    spread = FallbackUse("aten::take", 9, ("attn",), ("forward", "backward", "eval", "checkpoint"), "...",
                         bytes=10800, phase_bytes={"forward": 1000, "backward": 800, "eval": 3000, "checkpoint": 6000})
    placement = _placement(fallbacks=(spread,))
    assert fallback_bytes_per_iteration(placement) == 900  # (1000 + 800) / 2, not 10800 / 2
    assert measured_lane((), placement, step_bytes=1000).name == "dual-track"
    assert measured_lane((), placement, step_bytes=800).name == "linux-gpu-first"


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_fallback_bytes_are_recorded_per_phase(device):
    torch.manual_seed(0)
    model, x = FallbackNet().to(device), torch.randn(3, 4, device=device)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.warns(UserWarning, match="an unrelated warning"), PlacementRecorder(model, device) as recorder:
        for iteration in (1, 2):
            with recorder.phase("forward", iteration):
                loss = model(x).sum()
            with recorder.phase("backward", iteration):
                loss.backward()
            with recorder.phase("optimizer", iteration):
                optimizer.step()
                optimizer.zero_grad()
        with recorder.phase("eval", 2), torch.no_grad():
            model(x)
        with recorder.phase("checkpoint", 2):  # the round trip's two extra steps
            for _ in range(2):
                model(x).sum().backward()
    placement = recorder.result()
    uses = {f.op: f for f in placement.fallbacks}
    per_call = 200 if device == "cuda" else 0  # as above: 200 B per call on a device, nothing on the CPU
    assert uses["aten::take"].phase_bytes == {"forward": 2 * per_call, "eval": per_call, "checkpoint": 2 * per_call}
    assert uses["aten::put_"].phase_bytes == {"backward": 2 * per_call, "checkpoint": 2 * per_call}
    assert uses["aten::take"].bytes == 5 * per_call and placement.iterations == 2
    assert fallback_bytes_per_iteration(placement) == 2 * per_call  # (2 + 2 calls) x 200 B / 2 iterations


def test_a_parameter_off_the_target_device_is_dual_track():
    misplaced = ({"kind": "parameter", "name": "head.proj.weight", "device": "cpu", "bytes": 256},
                 {"kind": "parameter", "name": "head.proj.bias", "device": "cpu", "bytes": 16})
    lane = measured_lane((), _placement(misplaced=misplaced), step_bytes=1000)
    assert lane.reasons == ("2 parameters on cpu, not mps:0: head.proj.weight, head.proj.bias (272 B)",
                            "measured on mps:0")
    copy = Transfer("cpu()", "mps:0", "cpu", 1024, "head", "forward", 2)
    upload = Transfer("aten::_to_copy", "cpu", "mps:0", 256, "head", "forward", 2)
    lane = measured_lane((), _placement(transfers=(copy, upload)), step_bytes=1000)
    assert lane.reasons == ("head moves 512 B per iteration (2 calls in 2 iterations) from mps:0 to the host with "
                            "cpu() in forward", "measured on mps:0")
