"""How well a model's sentence embeddings keep a reference encoder's: the measure behind
--preserve-embeddings, computed on held-out sentences as the service embeds them (one sentence,
[CLS] ... [SEP], mean over its tokens, normalised).

- nearest-neighbour agreement: for each sentence, is its nearest other sentence the same under both
  models? (the share of sentences where it is; what a search user notices first)
- rank correlation (Spearman) of all pairwise similarities between the two models;
- mean cosine between each sentence's two vectors (only when both live in one space: same width,
  which a warm start from the reference guarantees).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from model.bert import BertModel
from model.tokenizer import WordPieceTokenizer
from trainer.data.tokens import TokenizedCorpus
from trainer.forward import mean_pooled

RETENTION_SEED = 400
RETENTION_SENTENCES = 400


@dataclass
class RetentionProbe:
    batches: list[tuple[torch.Tensor, torch.Tensor]]  # (input ids (B, T), attention mask (B, T))
    reference: np.ndarray  # (S, H) the reference encoder's normalised vectors


def probe_batches(corpus: TokenizedCorpus, tokenizer: WordPieceTokenizer, count: int = RETENTION_SENTENCES,
                  batch_size: int = 64, max_tokens: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` distinct held-out sentences of 6 to `max_tokens` - 2 pieces, in a fixed random order."""
    order = list(range(len(corpus.sentence_offsets) - 1))
    random.Random(RETENTION_SEED).shuffle(order)
    chosen: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for index in order:
        ids = corpus.sentence(index).tolist()
        if 6 <= len(ids) <= max_tokens - 2 and tuple(ids) not in seen:
            seen.add(tuple(ids))
            chosen.append([tokenizer.cls_id, *ids, tokenizer.sep_id])
        if len(chosen) == count:
            break
    batches = []
    for start in range(0, len(chosen), batch_size):
        part = chosen[start : start + batch_size]
        ids = torch.full((len(part), max(map(len, part))), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sentence in enumerate(part):
            ids[row, : len(sentence)] = torch.tensor(sentence)
            mask[row, : len(sentence)] = 1
        batches.append((ids, mask))
    return batches


@torch.inference_mode()
def sentence_vectors(encoder: BertModel, batches: list[tuple[torch.Tensor, torch.Tensor]],
                     device: torch.device) -> np.ndarray:
    """(S, H) normalised mean-pooled vectors, in float32."""
    was_training = encoder.training
    encoder.eval()
    out = []
    for ids, mask in batches:
        hidden = encoder.embed(ids.to(device), attention_mask=mask.to(device))  # the layer the service embeds with
        out.append(torch.nn.functional.normalize(mean_pooled(hidden.float(), mask.to(device)), dim=-1).cpu())
    encoder.train(was_training)
    return torch.cat(out).numpy()


def build_probe(corpus: TokenizedCorpus, tokenizer: WordPieceTokenizer, reference: BertModel,
                device: torch.device) -> RetentionProbe:
    batches = probe_batches(corpus, tokenizer)
    return RetentionProbe(batches, sentence_vectors(reference, batches, device))


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def retention_metrics(vectors: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Both (S, H·) normalised, row i the same sentence. See the module docstring."""
    if len(vectors) != len(reference) or len(vectors) < 3:
        raise ValueError("retention needs the same 3 or more sentences embedded by both models")
    ours, theirs = vectors @ vectors.T, reference @ reference.T  # (S, S) cosine similarities
    np.fill_diagonal(ours, -np.inf)
    np.fill_diagonal(theirs, -np.inf)
    agreement = float((ours.argmax(1) == theirs.argmax(1)).mean())
    upper = np.triu_indices(len(vectors), k=1)
    spearman = float(np.corrcoef(_ranks(ours[upper]), _ranks(theirs[upper]))[0, 1])
    result = {"nn_agreement": agreement, "similarity_spearman": spearman, "sentences": len(vectors)}
    if vectors.shape[1] == reference.shape[1]:
        result["mean_cosine"] = float((vectors * reference).sum(1).mean())
    return result


__all__ = ["RetentionProbe", "build_probe", "probe_batches", "retention_metrics", "sentence_vectors"]
