"""Late-interaction scores (MaxSim): for each document, the sum over the query's vectors of the best dot product with
any of the document's vectors. Every document of a request is scored at once: their vectors side by side in one
matrix, one product with the query's, then the best of each document's columns."""

from __future__ import annotations

import numpy as np


def maxsim(query: np.ndarray, documents: list[np.ndarray]) -> np.ndarray:
    """query (Lq, d), documents [(L_i, d)] each with at least one vector -> (N,) float64 scores."""
    sizes = np.array([len(d) for d in documents])
    if not len(documents) or (sizes == 0).any():
        raise ValueError("every document needs at least one vector")
    similarities = query.astype(np.float32) @ np.concatenate(documents).astype(np.float32).T  # (Lq, sum L_i)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    best = np.maximum.reduceat(similarities, starts, axis=1)  # (Lq, N): each query vector's best in each document
    return best.sum(axis=0, dtype=np.float64)
