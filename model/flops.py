"""How many FLOPs a BERT forward pass costs: for MFU figures and for pricing padding in the batcher."""

from __future__ import annotations

import torch

from model.config import BertConfig


def _dense_flops_per_token(config: BertConfig, layers: int | None = None) -> int:
    """Projections and feed-forward of `layers` layers (all by default; multiply-add = 2)."""
    h = config.hidden_size
    return (layers or config.num_hidden_layers) * (4 * h * h + 2 * h * config.intermediate_size) * 2


def _attention_flops_per_pair(config: BertConfig, layers: int | None = None) -> int:
    """QK^T and AV for one (query, key) pair, over `layers` layers (all by default)."""
    return (layers or config.num_hidden_layers) * 2 * config.hidden_size * 2


def model_flops_per_token(config: BertConfig, seq_len: int, mlm_fraction: float = 1.0) -> float:
    """Forward FLOPs per token (multiply-add = 2): dense layers, attention scores, MLM head."""
    h = config.hidden_size
    head = (h * h + h * config.vocab_size) * 2 * mlm_fraction
    return float(_dense_flops_per_token(config) + _attention_flops_per_pair(config) * seq_len + head)


def packed_batch_flops(config: BertConfig, count: int, longest: int, real: int, real_squares: int,
                       attention_per_sequence: bool = False, layers: int | None = None) -> tuple[float, float]:
    """(encoder FLOPs of one packed batch through `layers` layers (all by default), the part spent on padding).

    Token-wise layers see the `real` tokens only. Attention runs in the padded (count, longest)
    layout: count x longest^2 query-key pairs are computed where `real_squares` (the sum of squared
    lengths) are needed, and that difference is the only waste; or, with `attention_per_sequence`
    (on CPU, see `model.packing.attends_each_on_cpu`), on each sequence alone, wasting nothing.
    """
    return BatchPricer(config, layers)(count, longest, real, real_squares, attention_per_sequence)


class BatchPricer:
    """`packed_batch_flops` for one model and layer count, its costs per token and per attention pair worked out
    once: the batcher prices a few dozen candidate batches for every batch it forms."""

    def __init__(self, config: BertConfig, layers: int | None = None):
        self.per_token = _dense_flops_per_token(config, layers)
        self.per_pair = _attention_flops_per_pair(config, layers)

    def __call__(self, count: int, longest: int, real: int, real_squares: int,
                 attention_per_sequence: bool = False) -> tuple[float, float]:
        computed_pairs = real_squares if attention_per_sequence else count * longest * longest
        return (float(self.per_token * real + self.per_pair * computed_pairs),
                float(self.per_pair * (computed_pairs - real_squares)))


def count_parameters(model: torch.nn.Module, exclude_embeddings: bool = False) -> int:
    """Parameters of a model, each tied tensor once (the MLM decoder shares the word embeddings)."""
    seen: set[int] = set()
    total = 0
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if exclude_embeddings and "embeddings" in name:
            continue
        total += param.numel()
    return total
