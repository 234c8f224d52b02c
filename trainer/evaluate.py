"""Held-out evaluation on fixed inputs, so every evaluation of every run is comparable.

Two views of the model:
- pre-training metrics on fixed pairs with fixed masks, always at 15% whatever the training mask rate:
  MLM loss, perplexity and accuracy over the masked positions only (not averaged over padded
  prediction slots), and NSP accuracy over all pairs;
- whole-word fill-mask, as users call it: one whole word (a word that is one vocabulary piece) masked
  in each of a fixed set of held-out sentences, top-1 accuracy, beside the accuracy of the best
  constant guess on the same sentences (the most frequent masked word). Masked-token accuracy alone
  is flattered by punctuation, function words and word continuations.
Evaluation runs in float32 whatever precision training uses.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.tokenizer import WordPieceTokenizer
from trainer.data.examples import PairBatch, build_pairs, collate
from trainer.data.masking import MaskedBatch, mask_tokens, replaceable_ids
from trainer.data.tokens import TokenizedCorpus
from trainer.forward import pretraining_logits
from trainer.retention import RetentionProbe, retention_metrics, sentence_vectors

EVAL_PAIR_SEED = 20181011  # BERT's arXiv date; any fixed value works
EVAL_MASK_SEED = 4242
EVAL_MASK_RATE = 0.15
WHOLE_WORD_SEED = 7
WHOLE_WORD_SENTENCES = 2000


@dataclass
class WholeWordBatch:
    input_ids: torch.Tensor  # (B, T): [CLS] sentence [SEP], one word replaced by [MASK], padded
    attention_mask: torch.Tensor  # (B, T)
    positions: torch.Tensor  # (B, T) bool: the masked word
    labels: torch.Tensor  # (B,) the word's id


@dataclass
class EvalSet:
    batches: list[tuple[PairBatch, MaskedBatch]]
    whole_words: list[WholeWordBatch]
    constant_guess_accuracy: float  # always answering the most frequent masked word
    retention: RetentionProbe | None = None  # a warm start's reference sentence vectors (trainer.retention)


def build_eval_set(corpus: TokenizedCorpus, tokenizer: WordPieceTokenizer, vocab_size: int, max_seq_len: int,
                   examples: int, batch_size: int = 64, sentences: int = WHOLE_WORD_SENTENCES) -> EvalSet:
    pairs = build_pairs(corpus, max_seq_len, seed=EVAL_PAIR_SEED)
    random.Random(EVAL_PAIR_SEED).shuffle(pairs)
    pairs = pairs[:examples]
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
    replace = replaceable_ids(tokenizer, vocab_size)
    batches = []
    for start in range(0, len(pairs), batch_size):
        batch = collate(pairs[start : start + batch_size], tokenizer)
        masked = mask_tokens(batch.input_ids, batch.special_mask, generator, tokenizer.mask_id, replace, EVAL_MASK_RATE)
        batches.append((batch, masked))
    whole_words, constant = _whole_word_batches(corpus, tokenizer, max_seq_len, sentences, batch_size)
    return EvalSet(batches, whole_words, constant)


def whole_word_ids(tokenizer: WordPieceTokenizer) -> np.ndarray:
    """(V,) bool: pieces that are a word of letters on their own (not a continuation, not special)."""
    vocab = tokenizer.vocab
    flags = np.asarray([token.isalpha() for token in vocab], dtype=bool)
    flags[list(tokenizer.special_ids)] = False
    return flags


def _whole_word_batches(corpus: TokenizedCorpus, tokenizer: WordPieceTokenizer, max_seq_len: int, count: int,
                        batch_size: int) -> tuple[list[WholeWordBatch], float]:
    is_word = whole_word_ids(tokenizer)
    continues = np.asarray([token.startswith("##") for token in tokenizer.vocab], dtype=bool)
    rng = random.Random(WHOLE_WORD_SEED)
    order = list(range(len(corpus.sentence_offsets) - 1))
    rng.shuffle(order)
    chosen: list[tuple[list[int], int]] = []  # (sentence ids, masked index)
    for index in order:
        ids = corpus.sentence(index).astype(np.int64)
        if not 4 <= len(ids) <= max_seq_len - 2:
            continue
        following = np.append(ids[1:], tokenizer.sep_id)
        candidates = np.flatnonzero(is_word[ids] & ~continues[following])
        if len(candidates):
            chosen.append((ids.tolist(), int(candidates[rng.randrange(len(candidates))])))
        if len(chosen) == count:
            break
    targets = [ids[at] for ids, at in chosen]
    constant = Counter(targets).most_common(1)[0][1] / len(targets) if targets else 0.0
    batches = []
    for start in range(0, len(chosen), batch_size):
        part = chosen[start : start + batch_size]
        width = max(len(ids) for ids, _ in part) + 2
        input_ids = torch.full((len(part), width), tokenizer.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        positions = torch.zeros_like(input_ids, dtype=torch.bool)
        for row, (ids, at) in enumerate(part):
            input_ids[row, : len(ids) + 2] = torch.tensor([tokenizer.cls_id, *ids, tokenizer.sep_id])
            input_ids[row, at + 1] = tokenizer.mask_id
            attention[row, : len(ids) + 2] = 1
            positions[row, at + 1] = True
        batches.append(WholeWordBatch(input_ids, attention, positions, torch.tensor([ids[at] for ids, at in part])))
    return batches, constant


@torch.inference_mode()
def evaluate(model: BertForPreTraining, eval_set: EvalSet, device: torch.device) -> dict[str, float]:
    was_training = model.training
    model.eval()
    mlm_loss = mlm_correct = mlm_count = nsp_loss = nsp_correct = nsp_count = 0.0
    for batch, masked in eval_set.batches:
        mlm_logits, nsp_logits, _ = pretraining_logits(
            model, masked.input_ids.to(device), batch.token_type_ids.to(device), batch.attention_mask.to(device),
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
    word_correct = word_count = 0
    for words in eval_set.whole_words:
        hidden, _ = model.bert(words.input_ids.to(device), attention_mask=words.attention_mask.to(device))
        predicted = model.mlm_logits(hidden, words.positions.to(device)).argmax(-1)
        word_correct += int((predicted == words.labels.to(device)).sum())
        word_count += len(words.labels)
    retention = None
    if eval_set.retention is not None:
        vectors = sentence_vectors(model.bert, eval_set.retention.batches, device)
        retention = retention_metrics(vectors, eval_set.retention.reference)
    model.train(was_training)
    mean_mlm = mlm_loss / max(mlm_count, 1)
    word_accuracy = word_correct / max(word_count, 1)
    return {
        "mlm_loss": mean_mlm,
        "mlm_perplexity": math.exp(min(mean_mlm, 50.0)),
        "mlm_accuracy": mlm_correct / max(mlm_count, 1),
        "nsp_loss": nsp_loss / max(nsp_count, 1),
        "nsp_accuracy": nsp_correct / max(nsp_count, 1),
        "whole_word_accuracy": word_accuracy,
        "whole_word_constant_accuracy": eval_set.constant_guess_accuracy,
        "whole_word_vs_constant": word_accuracy / eval_set.constant_guess_accuracy if eval_set.constant_guess_accuracy else 0.0,
        "whole_word_sentences": int(word_count),
        "masked_tokens": int(mlm_count),
        "pairs": int(nsp_count),
        **({f"embedding_{key}": value for key, value in retention.items()} if retention else {}),
    }
