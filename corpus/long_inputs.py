"""`--long-input chunk`: a document longer than the model read whole, as the service's pooled routes read it with
`"long_input": "chunk"` (docs/long-inputs.md). The service's own code makes the windows
(service.frontend.long_inputs.windowed_items: `[CLS] pieces [SEP]` of the model's window length, neighbours sharing
`--long-input-overlap` pieces) and folds them (service.engine.long_inputs.fold_windows: the windows' pooled vectors
averaged, weighted by their tokens, then normalised if asked). The windows go into the job's batches with every other
row's sequence, under the same token budget; a document that fits the model stays one sequence and gets the vector it
gets without the option.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class _Sequence:
    """What windowed_items reads of an encoded text."""

    ids: list[int]
    type_ids: list[int]


def pooled_vectors(embedder, token_ids: list[list[int]], normalize: bool, on_batch=None) -> np.ndarray:
    """(len(token_ids), width) float32: each row's pooled vector, its windows folded into one where it is longer than
    the model takes. `normalize`: each row's vector (a long one's after the fold) scaled to unit length."""
    from service.engine.long_inputs import fold_windows
    from service.frontend.long_inputs import windowed_items

    sequences = [_Sequence(ids, [0] * len(ids)) for ids in token_ids]
    items = windowed_items(embedder.tokenizer, sequences, embedder.pooling, normalize, embedder.long_input_window,
                           embedder.long_input_overlap, "the text")
    results = fold_windows(items, embedder.compute(items, on_batch))
    return np.stack([result.vector for result in results])
