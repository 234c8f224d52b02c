"""The pre-training forward pass: MLM logits at the masked positions, NSP logits, and (for
--preserve-embeddings) the mean-pooled sentence vectors, computed with as little work as each needs."""

from __future__ import annotations

import torch
from torch import nn

from model.bert import BertForPreTraining, key_padding_mask


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, H) -> (B, H): the mean over real tokens, special tokens included (sentence-transformers' rule)."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def pooling_mask(attention_mask: torch.Tensor, mlm_positions: torch.Tensor, unmasked_only: bool) -> torch.Tensor:
    """The tokens a sentence vector averages: every real token, or those the masked-LM loss does not predict."""
    return attention_mask * ~mlm_positions if unmasked_only else attention_mask


def pretraining_logits(model: BertForPreTraining, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       attention_mask: torch.Tensor, mlm_positions: torch.Tensor, with_sentence_vectors: bool = False,
                       pool_unmasked_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(MLM logits at the boolean (B, T) `mlm_positions`, (N, V) row-major; NSP logits (B, 2); mean-pooled
    last-layer vectors (B, H) if asked, else None; over the tokens outside `mlm_positions` only if
    `pool_unmasked_only`).

    Equal to `model(...)`'s logits, for less work: without sentence vectors the heads read the last
    layer at the masked positions and [CLS] only, so that layer computes queries, attention, output
    projection and feed-forward for those ~16% of tokens (keys and values still for all). For `mini`
    this skips a fifth of the encoder's FLOPs. Sentence vectors need every token of the last layer.
    """
    if not (model.has_mlm_head and model.has_nsp_head):
        raise RuntimeError("pre-training needs both the masked-LM and the next-sentence head")
    embedded = model.bert.embeddings(input_ids, token_type_ids)
    key_mask = key_padding_mask(attention_mask)
    if with_sentence_vectors:
        hidden = model.bert.encoder(embedded, key_mask)  # (B, T, H)
        mlm = model.cls.predictions(hidden[mlm_positions])
        nsp = model.nsp_logits_from_cls(hidden[:, 0])
        return mlm, nsp, mean_pooled(hidden, pooling_mask(attention_mask, mlm_positions, pool_unmasked_only))
    is_cls = torch.zeros_like(mlm_positions)
    is_cls[:, 0] = True
    keep = mlm_positions | is_cls
    kept = model.bert.encoder(embedded, key_mask, keep_last=keep)  # (K, H)
    mlm = model.cls.predictions(kept[mlm_positions[keep]])
    nsp = model.nsp_logits_from_cls(kept[is_cls[keep]])
    return mlm, nsp, None


class PreTrainingStep(nn.Module):
    """DDP and torch.compile wrap a module's `forward`; this one's is `pretraining_logits`."""

    def __init__(self, model: BertForPreTraining, with_sentence_vectors: bool = False,
                 pool_unmasked_only: bool = False):
        super().__init__()
        self.model = model
        self.with_sentence_vectors = with_sentence_vectors
        self.pool_unmasked_only = pool_unmasked_only

    def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions):
        return pretraining_logits(self.model, input_ids, token_type_ids, attention_mask, mlm_positions,
                                  self.with_sentence_vectors, self.pool_unmasked_only)


__all__ = ["PreTrainingStep", "mean_pooled", "pooling_mask", "pretraining_logits"]
