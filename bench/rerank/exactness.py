"""How close the service's ColBERT vectors and MaxSim scores are to the libraries' own, on the same checkpoints:
PyLate's encoder against the service in float32, bfloat16 and int8 (every query's and document's vectors, every
score, each query's ranking of the documents), and colbert-ai's encoder against the service in float32."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import numpy as np

from devkit import colbert_reference
from devkit.server import start_service


@dataclass
class Agreement:
    reference: str  # the library and its precision
    served: str  # the service's precision
    vectors: int
    min_cosine: float
    mean_cosine: float
    max_score_difference: float  # against the library scoring each document alone
    max_rank_rerank_difference: float | None  # against PyLate's rank.rerank (documents padded beside the longest)
    rankings_kept: float  # share of queries whose whole ranking of the documents is the reference's
    top10_kept: float  # ... whose ten best documents, in order, are the reference's
    top1_kept: float  # ... whose best document is the reference's
    kendall_tau: float  # the rankings' agreement, the mean over queries (1: the same order)
    median_gap: float  # the reference's median score difference between neighbours in its ranking: what noise must
    # stay under for the order to hold (a projection trained for retrieval spreads them wider than a fresh one)


def served(checkpoint, dtype: str, queries: list[str], documents: list[str]) -> dict:
    """The service's vectors and scores for `queries` x `documents`, served in `dtype`."""
    process, url = start_service(checkpoint, "--dtype", dtype, timeout_s=600)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            q = client.post("/token-vectors", json={"inputs": queries, "mode": "query"}).json()["results"]
            d = client.post("/token-vectors", json={"inputs": documents}).json()["results"]
            scores = []
            for query in queries:
                ranked = client.post("/v1/rerank", json={"model": "m", "query": query, "documents": documents}).json()
                scores.append([r["relevance_score"] for r in sorted(ranked["results"], key=lambda r: r["index"])])
    finally:
        process.terminate()
        process.wait(timeout=60)
    return {"queries": [r["vectors"] for r in q], "documents": [r["vectors"] for r in d], "scores": scores}


def agreement(reference_name: str, served_name: str, want: dict, got: dict) -> Agreement:
    cosines = []
    for mine, theirs in zip(got["queries"] + got["documents"], want["queries"] + want["documents"]):
        a, b = np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        if a.shape != b.shape:
            raise SystemExit(f"{served_name}: a vector list of shape {a.shape} where {reference_name} has {b.shape}")
        cosines.extend((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
    mine, theirs = np.asarray(got["scores"]), np.asarray(want["scores"])
    orders = [(np.argsort(-m, kind="stable"), np.argsort(-t, kind="stable")) for m, t in zip(mine, theirs)]
    rank_scores = want.get("rank_scores")
    gaps = [np.median(-np.diff(np.sort(t)[::-1])) for t in theirs]
    return Agreement(reference_name, served_name, len(cosines), float(np.min(cosines)), float(np.mean(cosines)),
                     float(np.abs(mine - theirs).max()),
                     float(np.abs(mine - np.asarray(rank_scores)).max()) if rank_scores is not None else None,
                     float(np.mean([(a == b).all() for a, b in orders])),
                     float(np.mean([(a[:10] == b[:10]).all() for a, b in orders])),
                     float(np.mean([a[0] == b[0] for a, b in orders])),
                     float(np.mean([kendall_tau(m, t) for m, t in zip(mine, theirs)])), float(np.median(gaps)))


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two score lists: (concordant - discordant pairs) / all pairs."""
    upper = np.triu_indices(len(a), k=1)
    signs = np.sign(np.subtract.outer(a, a)[upper]) * np.sign(np.subtract.outer(b, b)[upper])
    return float(signs.sum() / len(signs))


def measure(models, queries: list[str], documents: list[str], dtypes: tuple[str, ...]) -> list[Agreement]:
    answer = colbert_reference.run([
        {"command": "encode", "checkpoint": str(models.pylate), "library": "pylate", "queries": queries,
         "documents": documents},
        {"command": "encode", "checkpoint": str(models.colbert_ai), "library": "colbert-ai", "queries": queries,
         "documents": documents}])
    pylate, colbert_ai = answer["results"]
    found = [agreement("PyLate float32", dtype, pylate, served(models.pylate, dtype, queries, documents))
             for dtype in dtypes]
    found.append(agreement("colbert-ai float32", "float32", colbert_ai,
                           served(models.colbert_ai, "float32", queries, documents)))
    return found
