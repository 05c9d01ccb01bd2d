"""Example target: a tiny Hugging Face BERT sequence classifier, built from a config (no download).

Shows a model whose inputs are a dict: opscan calls `model(**inputs)`. Because `labels` is among the
inputs, the model computes its own loss and opscan uses `outputs.loss` (no `loss_fn` needed).

The config asks for `attn_implementation="sdpa"` (supported by BERT in transformers 4.40 and later, and
the default there on recent torch): attention goes through torch.nn.functional.scaled_dot_product_attention
as in a real fine-tuning run. The second sequence is padded, so the attention mask is really applied.

Random weights; hidden size 64, 2 layers, 2 heads, vocabulary 1000; batch 2 of 16 tokens.
Runs offline: set HF_HUB_OFFLINE=1 (opscan's CLI sets it for you).

    opscan examples/hf_bert.py:build_model
"""

import torch
from transformers import BertConfig, BertForSequenceClassification

BATCH, SEQ, VOCAB = 2, 16, 1000


def build_model():
    """A 2-layer BERT classifier (2 labels) and a dict of input_ids, attention_mask and labels."""
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
        attn_implementation="sdpa",
    )
    model = BertForSequenceClassification(config)
    gen = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, SEQ // 2:] = 0  # the second sequence is padded
    inputs = {
        "input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen),
        "attention_mask": attention_mask,
        "labels": torch.tensor([0, 1]),
    }
    return model, inputs
