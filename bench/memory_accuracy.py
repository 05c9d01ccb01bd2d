"""Benchmark: the memory estimate users see against the peak of real training steps on a GPU.

**Estimate**: the report's `memory.peak_bytes` — exactly what `opscan TARGET` prints and writes (the
steady-state peak of the step as MPS runs it, max-pool indices left out: opscan/memory), taken from the
scan's own stages (`opscan.scan.prepare` + `memory_stage`) on fake tensors (the ViT on real ones: REAL_BUILD).

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

Every case runs in a **fresh process** (`--jobs` of them at a time; the allocator's counters are per process, so
cases beside each other on one GPU do not see each other's memory), the estimate in one child, the real steps
in another: nothing an earlier case left behind can be counted or subtracted.

`measured` is `torch.cuda.max_memory_allocated()` over the two steps minus two things, each printed:
- `baseline`: `torch.cuda.memory_allocated()` before the model exists (after CUDA's initialisation: 0 in a fresh
  process, printed so that it is seen to be);
- `library`: the bytes allocated at the reset before the two steps that no parameter, buffer, input or
  optimizer state holds (512-byte rounded as the allocator counts them): libraries' persistent workspaces, made
  in the warm-up step and alive through the measured ones. Of it, `cuBLAS` is what
  `torch._C._cuda_clearCublasWorkspaces()` frees after the steps (cuBLAS's and cuBLASLt's per-handle
  workspaces, one per handle and stream); the rest, if any, is printed beside it
  as `other`. MPS keeps its libraries' memory (MPSGraph, Metal Performance Shaders) out of PyTorch's allocator,
  so the estimate leaves it out too.
`tensors` is the peak of live tensor storages on the device during the same steps (opscan's StorageTracker,
as a dispatch mode: what kernels return, without kernel-internal scratch); `raw` is max_memory_allocated
itself.

On `--device cpu` (a dry run without a GPU) there is no allocator to read: `measured` and `tensors` are the
tracker's peak on the real CPU steps. That checks the estimate's fake-tensor trace and memory stage against the
same accounting on real tensors (the kernels the CPU really ran, real autograd, real AdamW state), not against
an independent measurement; the GPU run is the independent one.

What stays between estimate and measured: the fused dropout inside cuda's math attention (a 1-byte mask
where MPS keeps float noise: B x H x L x L x 3 bytes per layer in BERT and GPT-2), kernel-internal
scratch of the native cuda kernels (im2col columns of one sample per convolution), the allocator's 512-byte
rounding, and kernels whose cuda implementation allocates differently from the CPU one the trace sees.

Suite (the headline): resnet18 (224x224, batch 16/32/64), BERT-base (sequence 128, batch 4/8/16), GPT-2 small
(sequence 256, batch 2/4/8). Outside the suite, reported beside it: a CNN, mobilenet_v3_small (224x224,
depthwise convolutions, hardswish, squeeze-excite; batch 32/64); a ViT, torchvision's vit_b_16 (224x224, batch
8/32); an LLM, a 4-layer LLaMA (width 512, grouped-query attention, RMSNorm, rotary; sequence 512, batch 2/8);
a diffusion UNet, diffusers' UNet2DConditionModel (a small Stable-Diffusion-shaped config: 4 latent channels at
64x64, blocks of 128/256/256 channels with cross-attention to 77 text tokens of width 256; batch 4/16). No
per-model constant anywhere.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/memory_accuracy.py --jobs 4        # the GPU run (cuda)
    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/memory_accuracy.py --device cpu    # a dry run on the CPU

The last line is `memory_error_max: <pct> %` (worst |estimate/measured - 1| over the suite); the line before
gives the same over the models outside it. tests/test_memory_live.py::test_accuracy_benchmark_logic_on_cpu
runs this script's logic on a tiny case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

SPEC = f"{Path(__file__).resolve()}:build"
CASES = {"resnet18": (16, 32, 64), "bert": (4, 8, 16), "gpt2": (2, 4, 8)}
OUTSIDE = {"mobilenet_v3": (32, 64), "vit": (8, 32), "llama": (2, 8), "unet": (4, 16)}
TINY = {"tiny_cnn": (2, 4), "tiny_bert": (2, 4), "tiny_attention": (2, 4), "tiny_vit": (2, 4),
        "tiny_unet": (1, 2)}  # CPU checks of this script's logic
# built on real tensors, as `opscan TARGET` does without --fake: torchvision's ViT initialises its weights with
# trunc_normal_, which reads a tensor's value (data-dependent under FakeTensorMode, so --fake cannot build it)
REAL_BUILD = frozenset({"vit", "tiny_vit"})
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
    if name in ("vit", "tiny_vit"):
        return _vit(name, batch, gen)
    if name in ("unet", "tiny_unet"):
        return _unet(name, batch, gen)
    return _causal_lm(name, batch, gen)


def _vit(name: str, batch: int, gen):
    """torchvision's ViT-B/16 at 224x224 (tiny: 2 layers of width 64 at 32x32), 1000 classes."""
    from torchvision.models import VisionTransformer, vit_b_16

    model = vit_b_16(weights=None) if name == "vit" else VisionTransformer(32, 8, 2, 2, 64, 128)
    size = 224 if name == "vit" else 32
    images = torch.randn(batch, 3, size, size, generator=gen)
    return model, (images, torch.randint(0, 1000, (batch,), generator=gen))


def _unet(name: str, batch: int, gen):
    """diffusers' UNet2DConditionModel, a small Stable-Diffusion-shaped config (module docstring), with a noisy
    latent, a timestep per sample and text-encoder states; the loss is the predicted noise's mean square."""
    from diffusers import UNet2DConditionModel

    small = name == "unet"
    config = dict(sample_size=64 if small else 16, in_channels=4, out_channels=4, layers_per_block=2 if small else 1,
                  block_out_channels=(128, 256, 256) if small else (32, 64),
                  down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D") if small
                  else ("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D") if small
                  else ("UpBlock2D", "CrossAttnUpBlock2D"),
                  cross_attention_dim=256 if small else 32, attention_head_dim=8, norm_num_groups=32 if small else 16)
    model = UNet2DConditionModel(**config)
    side, width = config["sample_size"], config["cross_attention_dim"]
    inputs = {"sample": torch.randn(batch, 4, side, side, generator=gen),
              "timestep": torch.randint(0, 1000, (batch,), generator=gen),
              "encoder_hidden_states": torch.randn(batch, 77, width, generator=gen)}
    return model, inputs


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
    """Cross-entropy for the image cases; the Hugging Face models return their own loss; the UNet's prediction
    (diffusers' output: `.sample`) its mean square."""
    if isinstance(outputs, torch.Tensor):
        return F.cross_entropy(outputs, inputs[1]) if isinstance(inputs, tuple) else outputs.square().mean()
    if getattr(outputs, "loss", None) is None and getattr(outputs, "sample", None) is not None:
        return outputs.sample.square().mean()
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
    """The report's memory.peak_bytes for this case: the scan's own trace and memory stage, on fake tensors
    (real ones for REAL_BUILD)."""
    from opscan.scan import ScanOptions, memory_stage, prepare

    options = ScanOptions(SPEC, args={"name": name, "batch": batch}, fake=name not in REAL_BUILD)
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
    """One real run (bytes): the scored peak, the tensors' own peak, the baseline before the model, the library
    memory alive at the reset (of it, what clearing cuBLAS's workspaces freed), the raw peak."""

    peak: int
    tensors: int
    baseline: int = 0
    library: int = 0
    cublas: int = 0
    raw: int = 0


def measure(name: str, batch: int, device: str) -> Measured:
    """Two steady-state steps on `device`, after a warm-up step (see the module docstring); call it in a fresh
    process for a cuda figure (main() does)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from opscan.memory.tracker import track_step

    baseline = _baseline(device)  # before the model exists
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
            library = torch.cuda.memory_allocated() - baseline - _rounded(held, model, inputs)
        with tracker:
            for _ in range(2):
                train_step(model, optimizer, inputs)
    if device != "cuda":
        return Measured(tracker.peak, tracker.peak, raw=tracker.peak)
    torch.cuda.synchronize()
    raw = int(torch.cuda.max_memory_allocated())
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    cublas = before - torch.cuda.memory_allocated()
    return Measured(raw - baseline - library, tracker.peak, baseline, library, cublas, raw)


def _baseline(device: str) -> int:
    """What the allocator holds before the model exists, CUDA initialised (0 in a fresh process)."""
    if device != "cuda":
        return 0
    torch.cuda.init()
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


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


def child(kind: str, name: str, batch: int, device: str) -> dict:
    """One case's estimate or measurement, run in this (fresh) process."""
    if kind == "estimate":
        return {"estimate": estimate(name, batch)}
    return asdict(measure(name, batch, device))


def _in_child(kind: str, name: str, batch: int, device: str, threads: int) -> dict:
    """child() in a fresh interpreter: its last stdout line is the JSON of the result."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, "--child", kind, name, str(batch), "--device", device],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        print(f"{kind} of {name} at batch {batch} failed ({done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(cases: list[tuple[str, int]], device: str, jobs: int) -> tuple[float, int]:
    """Each case's estimate and measurement in fresh processes, `jobs` at a time; one line per case, in order;
    returns (the largest error in percent, the number of cases that failed: their lines say why)."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    worst, failed = 0.0, 0
    with ThreadPoolExecutor(jobs) as pool:
        pending = [(name, batch, pool.submit(_in_child, "estimate", name, batch, device, threads),
                    pool.submit(_in_child, "measure", name, batch, device, threads)) for name, batch in cases]
        for name, batch, est_future, got_future in pending:
            est, got = est_future.result(), got_future.result()
            if "error" in est or "error" in got:
                failed += 1
                print(f"{name:<13} {batch:>5} FAILED: {est.get('error') or got.get('error')}", flush=True)
                continue
            est, got = est["estimate"], Measured(**got)
            ratio = est / got.peak if got.peak else float("inf")
            worst = max(worst, abs(ratio - 1) * 100)
            print(f"{name:<13} {batch:>5} {est / 2**30:>11.3f} {got.peak / 2**30:>11.3f} {ratio:>6.3f} "
                  f"{got.tensors / 2**30:>10.3f} {got.baseline / 2**20:>11.1f} {got.cublas / 2**20:>9.1f} "
                  f"{(got.library - got.cublas) / 2**20:>8.1f} {got.raw / 2**30:>7.3f}", flush=True)
    return worst, failed


def _failed(failed: int) -> str:
    return f" ({failed} case{'s' if failed > 1 else ''} failed)" if failed else ""


def main(argv: list[str] | None = None) -> int:
    """Run the suite, then the models outside it; the last line is `memory_error_max: <pct> %`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--outside", default=",".join(OUTSIDE), help="models outside the suite ('' for none)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batches", type=int, nargs="*", help="only these batch sizes of each case")
    parser.add_argument("--jobs", type=int, default=1, help="fresh processes at a time (default 1)")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "NAME", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("memory_accuracy: no CUDA device here — run it on a machine with a GPU (or --device cpu)",
              file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]), args.device)))
        return 0
    table = {**CASES, **OUTSIDE, **TINY}

    def cases(names: str) -> list[tuple[str, int]]:
        return [(n, b) for n in names.split(",") if n for b in table[n] if not args.batches or b in args.batches]

    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (dry run: the tracker's peak)"
    print(f"device: {where}; torch {torch.__version__}; each case in fresh processes, {args.jobs} at a time")
    print(f"{'case':<13} {'batch':>5} {'estimate GB':>11} {'measured GB':>11} {'ratio':>6} {'tensors GB':>10} "
          f"{'baseline MB':>11} {'cuBLAS MB':>9} {'other MB':>8} {'raw GB':>7}", flush=True)
    worst, failed = run(cases(args.cases), args.device, args.jobs)
    outside = cases(args.outside)
    if outside:
        print("outside the suite:")
        beside, failed_beside = run(outside, args.device, args.jobs)
        print(f"memory_error_max_outside: {beside:.1f} %{_failed(failed_beside)}")
    print(f"memory_error_max: {worst:.1f} %{_failed(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
