"""Benchmark: opscan's memory estimate against `torch.cuda.max_memory_allocated()` on a real GPU.

For each model and batch the step is traced on fake tensors (opscan's estimate: tensor bytes of the
steady-state step, opscan/memory) and then run for real on cuda — three steps of the very same step
function (opscan.trace.step.run_train_step), the peak taken over all three, so AdamW's state is there.
The cuda run is set up to dispatch what MPS dispatches and what was traced:

- `torch.backends.cudnn.benchmark = False` (no autotuning workspaces);
- attention on the math path (flash, memory-efficient and cuDNN attention off), as MPS runs it with grad;
- `torch.optim.AdamW(foreach=False)`: the for-loop AdamW, MPS's default (cuda would default to foreach,
  whose temporaries span every parameter at once).

One MPS-only correction of the scan is left out of the estimate here: the scan counts max_pool2d's int64
indices as 0 bytes (MPS's own max_pool2d keeps none); cuda keeps them, and so does this estimate.
Expected differences: dropout (BERT, GPT-2) keeps a float32 noise tensor on CPU and MPS (at::dropout's
unfused path) but a 1-byte mask on cuda (fused native_dropout), so the estimate runs a few percent above
cuda there (BERT-base at batch 8: about 115 MB of 2.1 GB); cuda adds cuBLAS/cuDNN workspaces and rounds
each block up to 512 bytes, which the estimate (tensor bytes) does not see.

Cases: resnet18 (224x224, batch 16/32/64) and BERT-base (sequence 128, batch 4/8/16) — the models the
estimate was checked on — and GPT-2 small (sequence 256, batch 2/4/8), which it was not tuned on.

    PYTHONPATH=. python3 bench/memory_accuracy.py [--cases resnet18,bert,gpt2] [--device cuda]
    ...
    memory_error_max: 4.2 %

Needs torch with CUDA, torchvision and transformers; opscan is imported from the repository.
`--device cpu` replaces the GPU by opscan's own storage tracker on the CPU (tests/test_memory_bench.py
runs that on tiny cases).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SPEC = f"{Path(__file__).resolve()}:build"
CASES = {
    "resnet18": (16, 32, 64),
    "bert": (4, 8, 16),
    "gpt2": (2, 4, 8),
}
TINY = {"tiny_cnn": (2, 4), "tiny_bert": (2, 4), "tiny_attention": (2, 4)}  # CPU checks of this script's logic
STEPS = 3


def build(name: str = "resnet18", batch: int = 32):
    """(model, inputs) of one case, deterministic (the factory opscan traces and the GPU run both use)."""
    gen = torch.Generator().manual_seed(0)
    if name in ("resnet18", "tiny_cnn"):
        import torchvision

        size, classes = (224, 1000) if name == "resnet18" else (32, 10)
        model = torchvision.models.resnet18(weights=None, num_classes=classes)
        images = torch.randn(batch, 3, size, size, generator=gen)
        return model, (images, torch.randint(0, classes, (batch,), generator=gen))
    if name in ("bert", "tiny_bert"):
        from transformers import BertConfig, BertForSequenceClassification

        widths = {} if name == "bert" else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=128, vocab_size=1000)
        config = BertConfig(**widths, num_labels=2, attn_implementation="sdpa")
        ids = torch.randint(0, config.vocab_size, (batch, 128), generator=gen)
        return BertForSequenceClassification(config), {"input_ids": ids, "labels": torch.zeros(batch, dtype=torch.long)}
    if name == "tiny_attention":
        return _TinyAttention(), torch.randn(batch, 128, 32, generator=gen)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(attn_implementation="sdpa")
        ids = torch.randint(0, config.vocab_size, (batch, 256), generator=gen)
        return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids.clone()}
    raise ValueError(f"unknown case {name!r}")


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
    """opscan's steady-state peak estimate (bytes), traced on fake tensors."""
    from opscan.memory.estimate import estimate as sweep
    from opscan.memory.stage import where_of
    from opscan.scan import ScanOptions, _fake_choice, run_trace
    from opscan.target.load import load_target

    options = ScanOptions(SPEC, args={"name": name, "batch": batch}, fake=True)
    kb = _knowledge()
    target = load_target(options.target, options.args, [], _fake_choice(options))
    trackers: list = []
    trace = run_trace(target, options, kb, trackers)
    return sweep(trackers[0].timeline(batch), where_of(trace.calls)).peak.bytes


def _knowledge():
    from opscan.knowledge import load_knowledge

    return load_knowledge()


def measure(name: str, batch: int, device: str) -> int:
    """The peak over STEPS real steps on `device`: cuda's max_memory_allocated, or on cpu the bytes of live
    storages opscan's tracker counts (same step function, same optimizer)."""
    torch.manual_seed(0)
    model, inputs = build(name, batch)
    model = model.to(device).train()
    inputs = _to(inputs, device)
    optimizer = build_optimizer(model)
    if device == "cuda":
        _cuda_like_mps()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(STEPS):
            train_step(model, optimizer, inputs)
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    from opscan.memory.batch import Steer
    from opscan.memory.tracker import track_step

    tracker = track_step(model, inputs, ignore_device=None)
    with Steer(lambda op: True, (14, 0)), tracker:  # attention on the math path, as on MPS and the GPU run
        for _ in range(STEPS):
            train_step(model, optimizer, inputs)
    return tracker.peak


def _cuda_like_mps() -> None:
    torch.backends.cudnn.benchmark = False
    for switch in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, switch):
            getattr(torch.backends.cuda, switch)(False)
    torch.backends.cuda.enable_math_sdp(True)


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return type(value)(_to(v, device) for v in value)


def run(cases: dict, device: str) -> float:
    """Print one line per case and batch; returns the largest error in percent."""
    worst = 0.0
    print(f"{'case':<10} {'batch':>5} {'estimate GB':>12} {'measured GB':>12} {'ratio':>7}", flush=True)
    for name, batches in cases.items():
        for batch in batches:
            est, got = estimate(name, batch), measure(name, batch, device)
            ratio = est / got if got else float("inf")
            worst = max(worst, abs(ratio - 1) * 100)
            print(f"{name:<10} {batch:>5} {est / 2**30:>12.3f} {got / 2**30:>12.3f} {ratio:>7.3f}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return worst


def main(argv: list[str] | None = None) -> int:
    """Run the chosen cases; the last line is `memory_error_max: <pct> %`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("memory_accuracy: no CUDA device here — run it on a machine with a GPU (or --device cpu)",
              file=sys.stderr)
        return 2
    table = {**CASES, **TINY}
    worst = run({name: table[name] for name in args.cases.split(",")}, args.device)
    print(f"memory_error_max: {worst:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
