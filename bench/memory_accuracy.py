"""Benchmark: the memory estimate users see against the peak of real training steps on a GPU.

**Estimate**: the report's `memory.peak_bytes` — exactly what `opscan TARGET` prints and writes (the
steady-state peak of the step as MPS runs it, max-pool indices left out: opscan/memory), taken from the
scan's own stages (`opscan.scan.prepare` + `memory_stage`) on fake tensors.

**Measured**: the same model, inputs and step function (opscan.trace.step.run_train_step) run for real on
`--device` — one warm-up step, then the peak over two more, so AdamW's state is there as in the steady
state. The run dispatches what MPS dispatches wherever cuda would differ, each with its source:

- attention on the math path (`torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`), as MPS runs it with grad
  (mps_facts.md §8; opscan/trace/lens.py, row mps-sdpa);
- `torch.optim.AdamW(foreach=False)`: the for-loop AdamW, MPS's default (cuda's foreach path would keep
  temporaries spanning every parameter at once);
- `F.dropout` unfused, as at::dropout runs on MPS: a float noise tensor kept for backward (cuda's fused
  kernel keeps a 1-byte mask; aten/src/ATen/native/Dropout.cpp, `is_fused_kernel_acceptable` lists cuda,
  xpu, lazy and privateuseone, and `_dropout_impl` makes `empty_like(input).bernoulli_(1 - p).div_(1 - p)`);
- `F.max_pool2d` without kept indices: MPS's own `max_pool2d` saves the input and recomputes them in
  `max_pool2d_backward` (mps_facts.md §8 table; opscan/trace/lens.py, row mps-max-pool2d), while cuda's
  `max_pool2d_with_indices` keeps int64 indices for backward;
- on cuda, cuDNN off (`torch.backends.cudnn.enabled = False`): its convolution and batch-norm workspaces are
  allocator blocks no tensor owns (MPS runs them in MPSGraph, out of PyTorch's sight); PyTorch's native
  cuda kernels run instead.

`measured` is `torch.cuda.max_memory_allocated()` over the two steps minus the persistent library memory
alive before them (cuBLAS/cuBLASLt workspaces: the bytes allocated at the reset that no parameter, buffer,
input or optimizer state holds, 512-byte rounded as the allocator counts them), printed as `workspace MB`.
`tensors` is the peak of live tensor storages on the device during the same steps (opscan's StorageTracker,
as a dispatch mode: what kernels return, without kernel-internal scratch); `raw` is max_memory_allocated
itself. On `--device cpu` (a dry run without a GPU) measured and tensors are both the tracker's peak.

What stays between estimate and measured: the fused dropout inside cuda's math attention (a 1-byte mask
where MPS keeps float noise: B x H x L x L x 3 bytes per layer in BERT and GPT-2), kernel-internal
scratch of the native cuda kernels (im2col columns of one sample per convolution), the allocator's 512-byte
rounding, and kernels whose cuda implementation allocates differently from the CPU one the trace sees.

Suite (the headline): resnet18 (224x224, batch 16/32/64), BERT-base (sequence 128, batch 4/8/16), GPT-2 small
(sequence 256, batch 2/4/8). Outside the suite, reported beside it: mobilenet_v3_small (224x224, depthwise
convolutions, hardswish, squeeze-excite; batch 32/64) and a 4-layer LLaMA (width 512, grouped-query
attention, RMSNorm, rotary; sequence 512, batch 2/8). No per-model constant anywhere.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/memory_accuracy.py                 # the GPU run (cuda)
    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/memory_accuracy.py --device cpu    # a dry run on the CPU

The last line is `memory_error_max: <pct> %` (worst |estimate/measured - 1| over the suite); the line before
gives the same over the models outside it. tests/test_memory_live.py::test_accuracy_benchmark_logic_on_cpu
runs this script's logic on a tiny case.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

SPEC = f"{Path(__file__).resolve()}:build"
CASES = {"resnet18": (16, 32, 64), "bert": (4, 8, 16), "gpt2": (2, 4, 8)}
OUTSIDE = {"mobilenet_v3": (32, 64), "llama": (2, 8)}
TINY = {"tiny_cnn": (2, 4), "tiny_bert": (2, 4), "tiny_attention": (2, 4)}  # CPU checks of this script's logic
ALLOCATOR_ROUNDING = 512  # the cuda caching allocator rounds every block up to a multiple of 512 bytes


def build(name: str = "resnet18", batch: int = 32):
    """(model, inputs) of one case, deterministic (the factory opscan traces and the real run both use)."""
    gen = torch.Generator().manual_seed(0)
    if name in ("resnet18", "tiny_cnn", "mobilenet_v3"):
        import torchvision

        size, classes = (32, 10) if name == "tiny_cnn" else (224, 1000)
        factory = torchvision.models.mobilenet_v3_small if name == "mobilenet_v3" else torchvision.models.resnet18
        images = torch.randn(batch, 3, size, size, generator=gen)
        return factory(weights=None, num_classes=classes), (images, torch.randint(0, classes, (batch,), generator=gen))
    if name in ("bert", "tiny_bert"):
        from transformers import BertConfig, BertForSequenceClassification

        widths = {} if name == "bert" else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=128, vocab_size=1000)
        config = BertConfig(**widths, num_labels=2, attn_implementation="sdpa")
        ids = torch.randint(0, config.vocab_size, (batch, 128), generator=gen)
        return BertForSequenceClassification(config), {"input_ids": ids, "labels": torch.zeros(batch, dtype=torch.long)}
    if name == "tiny_attention":
        return _TinyAttention(), torch.randn(batch, 128, 32, generator=gen)
    return _causal_lm(name, batch, gen)


def _causal_lm(name: str, batch: int, gen):
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config, seq = GPT2Config(attn_implementation="sdpa"), 256
        model = GPT2LMHeadModel(config)
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config, seq = LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=4,
                                  num_hidden_layers=4, vocab_size=32000, attn_implementation="sdpa"), 512
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(f"unknown case {name!r}")
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    return model, {"input_ids": ids, "labels": ids.clone()}


class _TinyAttention(torch.nn.Module):
    """qkv projection, attention over 128 tokens in 4 heads, output projection (plain torch, for the CPU test)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, 32))


def loss_fn(outputs, inputs):
    """Cross-entropy for the image cases; the Hugging Face models return their own loss."""
    if isinstance(outputs, torch.Tensor):
        return F.cross_entropy(outputs, inputs[1]) if isinstance(inputs, tuple) else outputs.square().mean()
    return outputs.loss


def build_optimizer(model):
    """AdamW as MPS runs it by default: the for-loop implementation."""
    return torch.optim.AdamW(model.parameters(), foreach=False)


def train_step(model, optimizer, inputs):
    """Forward on the images only (the labels are the loss's), loss, backward, AdamW step, zero_grad."""
    from opscan.trace.step import call_model

    outputs = call_model(model, inputs[0] if isinstance(inputs, tuple) else inputs)
    loss = loss_fn(outputs, inputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def estimate(name: str, batch: int) -> int:
    """The report's memory.peak_bytes for this case: the scan's own trace and memory stage, fake tensors."""
    from opscan.scan import ScanOptions, memory_stage, prepare

    options = ScanOptions(SPEC, args={"name": name, "batch": batch}, fake=True)
    prepared = prepare(options)
    section = memory_stage(prepared, options)
    return int(section["peak_bytes"])


class AsOnMps(TorchFunctionMode):
    """Dropout and max-pooling as MPS runs them (see the module docstring); everything else unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            return _dropout(*args, **kwargs)
        if func is F.max_pool2d and not kwargs.get("return_indices") and not (len(args) > 6 and args[6]):
            return _MaxPool2d.apply(*_pool_args(*args, **kwargs))
        return func(*args, **kwargs)


def _dropout(input, p=0.5, training=True, inplace=False):
    """at::native::_dropout_impl: a float noise tensor, scaled, multiplied in (and saved by the multiply)."""
    if p == 0 or not training:
        return input
    if p == 1:
        return input.mul_(0) if inplace else input * 0
    noise = torch.empty_like(input).bernoulli_(1 - p)
    noise.div_(1 - p)
    return input.mul_(noise) if inplace else input * noise


def _pool_args(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    pair = torch.nn.modules.utils._pair
    return input, pair(kernel_size), pair(stride if stride else kernel_size), pair(padding), pair(dilation), ceil_mode


class _MaxPool2d(torch.autograd.Function):
    """max_pool2d keeping only its input for backward, as MPS's max_pool2d / max_pool2d_backward do."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode):
        ctx.save_for_backward(x)
        ctx.args = (kernel, stride, padding, dilation, ceil_mode)
        return torch.ops.aten.max_pool2d_with_indices(x, *ctx.args)[0]  # the indices are freed here

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        indices = torch.ops.aten.max_pool2d_with_indices(x, *ctx.args)[1]
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, *ctx.args, indices), *[None] * 5


@dataclass(frozen=True)
class Measured:
    """One real run: the scored peak, the tensors' own peak, the library workspace subtracted, the raw peak."""

    peak: int
    tensors: int
    workspace: int
    raw: int


def measure(name: str, batch: int, device: str) -> Measured:
    """Two steady-state steps on `device`, after a warm-up step (see the module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from opscan.memory.tracker import track_step

    torch.manual_seed(0)
    model, inputs = build(name, batch)
    model, inputs = model.to(device).train(), _to(inputs, device)
    optimizer = build_optimizer(model)
    if device == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.enabled = False
    with sdpa_kernel([SDPBackend.MATH]), AsOnMps():
        train_step(model, optimizer, inputs)
        held = _held(model, inputs, optimizer)
        tracker = track_step(model, inputs, ignore_device=None)
        tracker.register(held, "optimizer_state")
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            workspace = torch.cuda.memory_allocated() - _rounded(held, model, inputs)
        with tracker:
            for _ in range(2):
                train_step(model, optimizer, inputs)
    if device != "cuda":
        return Measured(tracker.peak, tracker.peak, 0, tracker.peak)
    torch.cuda.synchronize()
    raw = int(torch.cuda.max_memory_allocated())
    return Measured(raw - workspace, tracker.peak, workspace, raw)


def _held(model, inputs, optimizer) -> list[torch.Tensor]:
    """The optimizer state alive between steps (parameters, buffers and inputs are registered by track_step)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _rounded(state: list[torch.Tensor], model, inputs) -> int:
    """Bytes the allocator holds for the tensors alive between steps: each storage once, rounded up to 512."""
    from opscan.trace.tensors import tensors_in

    storages = {}
    for t in [*model.parameters(), *model.buffers(), *tensors_in(inputs), *state]:
        if t.device.type == "cuda":
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(-(-n // ALLOCATOR_ROUNDING) * ALLOCATOR_ROUNDING for n in storages.values())


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return type(value)(_to(v, device) for v in value)


def run(cases: dict, device: str) -> float:
    """Print one line per case and batch; returns the largest error in percent."""
    worst = 0.0
    for name, batches in cases.items():
        for batch in batches:
            est, got = estimate(name, batch), measure(name, batch, device)
            ratio = est / got.peak if got.peak else float("inf")
            worst = max(worst, abs(ratio - 1) * 100)
            print(f"{name:<13} {batch:>5} {est / 2**30:>12.3f} {got.peak / 2**30:>12.3f} {ratio:>7.3f} "
                  f"{got.tensors / 2**30:>10.3f} {got.workspace / 2**20:>12.1f} {got.raw / 2**30:>8.3f}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return worst


def main(argv: list[str] | None = None) -> int:
    """Run the suite, then the models outside it; the last line is `memory_error_max: <pct> %`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--outside", default=",".join(OUTSIDE), help="models outside the suite ('' for none)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("memory_accuracy: no CUDA device here — run it on a machine with a GPU (or --device cpu)",
              file=sys.stderr)
        return 2
    table = {**CASES, **OUTSIDE, **TINY}
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (dry run: the tracker's peak)"
    print(f"device: {where}; torch {torch.__version__}")
    print(f"{'case':<13} {'batch':>5} {'estimate GB':>12} {'measured GB':>12} {'ratio':>7} {'tensors GB':>10} "
          f"{'workspace MB':>12} {'raw GB':>8}", flush=True)
    worst = run({name: table[name] for name in args.cases.split(",") if name}, args.device)
    outside = [name for name in args.outside.split(",") if name]
    if outside:
        print("outside the suite:")
        beside = run({name: table[name] for name in outside}, args.device)
        print(f"memory_error_max_outside: {beside:.1f} %")
    print(f"memory_error_max: {worst:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
