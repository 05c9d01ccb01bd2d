"""Example target: a LLaMA-style causal language model at 7B, 70B or 405B width, built from a config.

The question people ask before buying a Mac: "will my 7B fine-tune run on it?". The model is far too
big to build on the machine they ask from, so opscan builds it, and its inputs, inside
FakeTensorMode (`--fake`; chosen by itself when the parameters would not fit in RAM): the whole
training step (forward, loss, backward, AdamW) is traced without allocating a weight.

| size  | hidden | heads | kv heads | intermediate | vocab | layers (default) |
|-------|--------|-------|----------|--------------|-------|------------------|
| 7b    | 4096   | 32    | 32       | 11008        | 32000 | 32               |
| 70b   | 8192   | 64    | 8        | 28672        | 32000 | 80               |
| 405b  | 16384  | 128   | 8        | 53248        | 128256| 126              |
| tiny  | 64     | 4     | 2        | 128          | 1000  | 2                |

Batch 1 of 2048 tokens by default; `labels` are the inputs, so the model computes its own loss.

    opscan examples/llama_big.py:build_model --arg size=7b              # 32 layers, fake tensors
    opscan examples/llama_big.py:build_model --arg size=70b --arg layers=8 --fake
    opscan examples/llama_big.py:build_model --arg size=405b --fake     # 126 layers: 3 .. 124 replicated
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {
    "7b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008,
               vocab_size=32000, num_hidden_layers=32),
    "70b": dict(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                vocab_size=32000, num_hidden_layers=80),
    "405b": dict(hidden_size=16384, num_attention_heads=128, num_key_value_heads=8, intermediate_size=53248,
                 vocab_size=128256, num_hidden_layers=126),  # Llama 3.1 405B's shape
    "tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                 vocab_size=1000, num_hidden_layers=2),
}


def config(size: str = "7b", layers: int | None = None) -> LlamaConfig:
    """The LlamaConfig of one of SIZES, with `layers` decoder layers (default: the size's own)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    widths = dict(SIZES[size])
    if layers is not None:
        widths["num_hidden_layers"] = int(layers)
    return LlamaConfig(**widths, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def build_model(size: str = "7b", layers: int | None = None, batch: int = 1, seq: int = 2048):
    """A LLaMA causal LM of `size` with `layers` decoder layers, and input_ids/labels of batch x seq."""
    cfg = config(size, layers)
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    return model, {"input_ids": input_ids, "labels": input_ids.clone()}
