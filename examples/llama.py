"""Example target: a tiny Hugging Face LLaMA causal language model, built from a config (no download).

Shows a decoder-only LLM's training step: RMSNorm, rotary embeddings, grouped-query attention
(4 query heads sharing 2 key/value heads) and SwiGLU MLPs. `labels` is among the inputs, so the
model computes its own shifted cross-entropy and opscan uses `outputs.loss`.

Random weights; hidden size 64, 2 layers, intermediate 128, vocabulary 1000; batch 2 of 16 tokens.
Runs offline: set HF_HUB_OFFLINE=1 (opscan's CLI sets it for you).

    opscan examples/llama.py:build_model
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ, VOCAB = 2, 16, 1000


def build_model():
    """A 2-layer LLaMA with grouped-query attention, and a dict of input_ids and labels."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": input_ids, "labels": input_ids.clone()}
