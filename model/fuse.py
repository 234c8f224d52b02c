"""Serving-time fusion: one matrix product for each attention layer's query, key and value.

Three products of (N, H) by (H, H) and a concatenation become one (N, H) by (H, 3H): one operator call instead
of four per layer (each call hands the GIL over and back, which is what a small model's batch costs on a CPU,
and a kernel launch on a GPU) and one pass over the input. The int8 path fuses the same three in its own way
(`kernels.quantize`); this is the float one. For inference only: the separate projections are dropped.
"""

from __future__ import annotations

import torch
from torch import nn

from model.bert import BertForPreTraining, BertSelfAttention


@torch.no_grad()
def fuse_attention_projections(model: BertForPreTraining) -> BertForPreTraining:
    """The model with each attention layer's query, key and value Linears replaced by one (in place)."""
    for attention in model.modules():
        if not isinstance(attention, BertSelfAttention) or attention.fused_qkv is not None:
            continue
        parts = (attention.query, attention.key, attention.value)
        weight = torch.cat([p.weight for p in parts])
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=True, device=weight.device, dtype=weight.dtype)
        fused.weight.copy_(weight)
        fused.bias.copy_(torch.cat([p.bias for p in parts]))
        attention.fused_qkv = fused.train(attention.training)
        attention.query = attention.key = attention.value = None
    return model
