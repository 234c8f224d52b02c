"""A token classifier's logits -> entities, as transformers' `token-classification` pipeline makes them.

Per window: softmax over the labels at each token, special tokens dropped, then the aggregation strategy:
- none: one entity per token (`entity`, `score`, `index`, `word`, `start`, `end`);
- simple: adjacent tokens of one tag (B-X then I-X..., or plain X X) grouped (`entity_group`), score the mean;
- first / average / max: each word first takes one label (its first piece's, its pieces' mean scores', or
  its best-scoring piece's), then words are grouped as `simple` groups tokens.
`ignore_labels` (default ["O"]) are dropped; with several windows (`stride`), overlapping entities keep the
longest (then the best scoring), as the pipeline does. Offsets are characters of the input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.tokenizer import TextPieces, WordPieceTokenizer
from service.frontend.token_windows import Window

STRATEGIES = ("none", "simple", "first", "average", "max")


@dataclass
class Piece:
    word: str  # the token string ("##ing"), or the text itself for [UNK]
    scores: np.ndarray  # (num_labels,) softmax
    start: int
    end: int
    index: int  # the token's index in its window
    is_subword: bool


def window_entities(text: str, pieces: TextPieces, window: Window, logits: np.ndarray, labels: tuple[str, ...],
                    strategy: str, ignore_labels: list[str], tokenizer: WordPieceTokenizer) -> list[dict]:
    """Entities of one window; `logits` (window length, num_labels) include [CLS] and [SEP]."""
    logits = logits.astype(np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores = shifted / shifted.sum(axis=-1, keepdims=True)
    found = []
    for n in range(window.start, window.stop):
        index = window.first + n - window.start
        start, end = pieces.offsets[n]
        token, source = pieces.tokens[n], text[start:end]
        unknown = pieces.ids[n] == tokenizer.unk_id
        found.append(Piece(source if unknown else token, scores[index], start, end, index,
                           not unknown and len(token) != len(source)))
    if strategy in ("none", "simple"):
        entities = [{"entity": labels[int(p.scores.argmax())], "score": float(p.scores.max()), "index": p.index,
                     "word": p.word, "start": p.start, "end": p.end} for p in found]
    else:
        entities = [_word_entity(group, strategy, labels, tokenizer) for group in _words(found)]
    if strategy != "none":
        entities = _group(entities, tokenizer)
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]


def _words(found: list[Piece]) -> list[list[Piece]]:
    groups: list[list[Piece]] = []
    for piece in found:
        if groups and piece.is_subword:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    return groups


def _word_entity(pieces: list[Piece], strategy: str, labels: tuple[str, ...], tokenizer: WordPieceTokenizer) -> dict:
    if strategy == "first":
        scores = pieces[0].scores
    elif strategy == "max":
        scores = max(pieces, key=lambda p: p.scores.max()).scores
    else:
        scores = np.nanmean(np.stack([p.scores for p in pieces]), axis=0)
    best = int(scores.argmax())
    return {"entity": labels[best], "score": float(scores[best]),
            "word": tokenizer.join_tokens([p.word for p in pieces]),
            "start": pieces[0].start, "end": pieces[-1].end}


def _tag(label: str) -> tuple[str, str]:
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label  # not in B-/I- form: a continuation


def _group(entities: list[dict], tokenizer: WordPieceTokenizer) -> list[dict]:
    """Adjacent entities of one tag grouped; a B- starts a new group."""
    groups: list[list[dict]] = []
    for entity in entities:
        bi, tag = _tag(entity["entity"])
        if groups and tag == _tag(groups[-1][-1]["entity"])[1] and bi != "B":
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [{"entity_group": group[0]["entity"].split("-", 1)[-1],
             "score": float(np.nanmean([e["score"] for e in group])),
             "word": tokenizer.join_tokens([e["word"] for e in group]),
             "start": group[0]["start"], "end": group[-1]["end"]} for group in groups]


def merge_windows(entities: list[dict]) -> list[dict]:
    """Entities of overlapping windows: of those that overlap, the longest (then the best scoring) stays."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda e: e["start"])
    kept, previous = [], entities[0]
    for entity in entities:
        if previous["start"] <= entity["start"] < previous["end"]:
            length, previous_length = entity["end"] - entity["start"], previous["end"] - previous["start"]
            if length > previous_length or (length == previous_length and entity["score"] > previous["score"]):
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept
