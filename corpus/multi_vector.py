"""`--multi-vector`: each row's ColBERT token vectors, as the service's /token-vectors gives them for the same text in
the same mode (and so as PyLate's and colbert-ai's encoders do): the markers, a query's [MASK] expansion to its length,
a document's skiplist, the projection and the normalisation are the service's own code
(service.frontend.colbert_inputs makes the items, service.engine.colbert_head computes them); this module only tokenizes
a unit's rows for it and runs the items through the job's batcher.

    reader:  text -> [CLS] pieces [SEP] (a query cut to its length; a document cut under --truncate; too long: a
             rejected row, unless --long-input chunk)                                      tokenize_for_colbert
    engine:  those ids -> the ColBERT's items (a long document's windows) -> (vectors, dim) per row   token_vectors

The sequences between the two stages are plain token ids, so that the Ray job carries them as it carries any job's.
"""

from __future__ import annotations

import numpy as np

from corpus.errors import Rejected
from corpus.tokenized import Tokenized, TokenRule

TOO_LONG = ("is {length} tokens long as a ColBERT document; this ColBERT reads at most {limit} (--truncate cuts it as "
            "its encoder does, --long-input chunk reads it in windows)")


def tokenize_for_colbert(unit, documents: list, rejects: list[Rejected], rule: TokenRule) -> Tokenized:
    """Each document as `[CLS] pieces [SEP]`, the pieces it will be read with (the markers and the expansion are put
    on in the engine stage, by the service's code). `tokens` are those sequences' lengths: the text's own tokens, as
    the service's usage counts a chunked input."""
    colbert, mode = rule.colbert, rule.mode
    tokenizer = colbert.tokenizer
    room = colbert.room(mode)
    ids, token_ids = [], []
    for document, encoding in zip(documents, tokenizer.encode_batch([d.text for d in documents])):
        pieces = encoding.ids[1:-1]
        reason = _refused(colbert, pieces, mode, room, rule)
        if reason:
            rejects.append(Rejected(document.source, document.row, document.doc_id, reason))
            continue
        if mode == "query" or rule.truncate:
            pieces = pieces[:room]  # as the encoders cut (the service cuts a query the same way)
        ids.append(document.doc_id)
        token_ids.append([tokenizer.cls_id, *pieces, tokenizer.sep_id])
    rejects.sort(key=lambda r: r.row)
    return Tokenized(unit, ids, token_ids, [len(t) for t in token_ids], None, rejects, len(ids))


def _refused(colbert, pieces: list[int], mode: str, room: int, rule: TokenRule) -> str | None:
    if mode == "query":
        if all(piece in colbert.skiplist for piece in pieces):
            return "holds only skiplist tokens (punctuation): a query of them matches nothing"
        return None
    if len(pieces) > room and not rule.truncate and rule.long_input != "chunk":
        return TOO_LONG.format(length=len(colbert.head("document")) + len(pieces) + 1,
                               limit=colbert.recipe.document_length)
    return None


def token_vectors(embedder, token_ids: list[list[int]], on_batch=None) -> list[np.ndarray]:
    """Each row's (vectors, dim) float32 array, L2-normalised rows, in input order. `token_ids` are
    tokenize_for_colbert's sequences; a document longer than the ColBERT's length is read in windows overlapping
    by `embedder.long_input_overlap` pieces, its vectors every window's in order (as /token-vectors with
    long_input: chunk)."""
    from service.frontend.colbert_inputs import colbert_input, vectors_per_text

    colbert, mode = embedder.rule.colbert, embedder.rule.mode
    made = [colbert_input(colbert, ids[1:-1], mode, "chunk", embedder.long_input_overlap, "the text")
            for ids in token_ids]
    results = embedder.compute([item for m in made for item in m.items], on_batch)
    return vectors_per_text(made, results)
