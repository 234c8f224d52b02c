"""Vectors cut to their first dimensions (Matryoshka embeddings), as /embed's `dimensions` and the corpus job's
`--dimensions` give them: the first `dimensions` values, normalized again over what is left when asked. One
function for both, so that a vector cut by the service and by the job is the same to the bit."""

from __future__ import annotations

import numpy as np


def shorten(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """`vectors` (..., H) cut to (..., dimensions); with `normalize`, each one over its own length after the cut."""
    cut = vectors[..., :dimensions]
    if not normalize:
        return cut
    # Over the last axis for a single vector too: numpy sums a row the same way whether it stands alone or in a matrix.
    norms = np.linalg.norm(cut, axis=-1, keepdims=True)
    return cut / np.maximum(norms, 1e-12)
