"""Held-out evaluation with fixed pairs and fixed masks, so every evaluation of every run is comparable.

MLM loss, perplexity and accuracy are over the masked positions only (not averaged over padded
prediction slots); NSP accuracy is over all pairs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.tokenizer import WordPieceTokenizer
from trainer.examples import PairBatch, TokenizedCorpus, build_pairs, collate
from trainer.masking import MaskedBatch, mask_tokens, replaceable_ids

EVAL_PAIR_SEED = 20181011  # BERT's arXiv date; any fixed value works
EVAL_MASK_SEED = 4242


@dataclass
class EvalSet:
    batches: list[tuple[PairBatch, MaskedBatch]]


def build_eval_set(corpus: TokenizedCorpus, tokenizer: WordPieceTokenizer, vocab_size: int, max_seq_len: int,
                   mask_rate: float, examples: int, batch_size: int = 64) -> EvalSet:
    pairs = build_pairs(corpus, max_seq_len, seed=EVAL_PAIR_SEED)
    random.Random(EVAL_PAIR_SEED).shuffle(pairs)
    pairs = pairs[:examples]
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
    replace = replaceable_ids(tokenizer, vocab_size)
    batches = []
    for start in range(0, len(pairs), batch_size):
        batch = collate(pairs[start : start + batch_size], tokenizer)
        masked = mask_tokens(batch.input_ids, batch.special_mask, generator, tokenizer.mask_id, replace, mask_rate)
        batches.append((batch, masked))
    return EvalSet(batches)


@torch.inference_mode()
def evaluate(model: BertForPreTraining, eval_set: EvalSet, device: torch.device,
             autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    was_training = model.training
    model.eval()
    mlm_loss = mlm_correct = mlm_count = nsp_loss = nsp_correct = nsp_count = 0.0
    for batch, masked in eval_set.batches:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            mlm_logits, nsp_logits = model.pretraining_logits(
                masked.input_ids.to(device), batch.token_type_ids.to(device), batch.attention_mask.to(device),
                masked.positions.to(device))
        labels = masked.labels.to(device)
        logits = mlm_logits.float()
        mlm_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        mlm_correct += (logits.argmax(-1) == labels).sum().item()
        mlm_count += labels.numel()
        nsp_labels = batch.nsp_labels.to(device)
        nsp_logits = nsp_logits.float()
        nsp_loss += F.cross_entropy(nsp_logits, nsp_labels, reduction="sum").item()
        nsp_correct += (nsp_logits.argmax(-1) == nsp_labels).sum().item()
        nsp_count += nsp_labels.numel()
    model.train(was_training)
    mean_mlm = mlm_loss / max(mlm_count, 1)
    return {
        "mlm_loss": mean_mlm,
        "mlm_perplexity": math.exp(min(mean_mlm, 50.0)),
        "mlm_accuracy": mlm_correct / max(mlm_count, 1),
        "nsp_loss": nsp_loss / max(nsp_count, 1),
        "nsp_accuracy": nsp_correct / max(nsp_count, 1),
        "masked_tokens": int(mlm_count),
        "pairs": int(nsp_count),
    }
