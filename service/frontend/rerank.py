"""Reranking with a cross-encoder, for every API shape that offers it (TEI's HTTP /rerank, its gRPC Rerank and
RerankStream): what the checkpoint must have, and each text's score against the query."""

from __future__ import annotations

import numpy as np

from model.labels import LabelSpec
from service.errors import ServiceError
from service.frontend.frontdoor import FrontDoor, Waiter
from service.frontend.inputs import Preparation


def require_cross_encoder(door: FrontDoor, call: str = "/rerank") -> None:
    """Refuse (424 on HTTP, FAILED_PRECONDITION on gRPC) a checkpoint whose classifier cannot rank pairs."""
    if door.num_labels and not door.classifier_pairs:
        raise ServiceError("unsupported", f"{call} needs a cross-encoder (a classifier of [query, text] pairs); this "
                                          f"checkpoint's classifier reads single texts. It has: {door.heads()}")
    if door.num_labels > 1:
        raise ServiceError("unsupported", f"{call} needs one relevance score per pair; this checkpoint's classifier "
                                          f"has {door.num_labels} outputs (use /predict)")


async def rerank_scores(door: FrontDoor, labels: LabelSpec, query: str, texts: list[str], prep: Preparation,
                        raw_scores: bool, gone: Waiter = None, call: str = "/rerank") -> np.ndarray:
    """(len(texts),) scores of (query, text) in the texts' order: sigmoid of the logit, or the logit itself."""
    require_cross_encoder(door, call)
    if not texts:
        raise ServiceError("empty", "texts is empty; send at least one text to rank", param="texts")
    door.check_query(query, prep)
    logits = await door.classify([[query, text] for text in texts], prep, gone=gone, field="texts")
    return labels.scores(np.stack(logits)[:, 0], raw=raw_scores)


def best_first(scores: np.ndarray) -> np.ndarray:
    """Indices from the highest score down (ties keep the texts' order)."""
    return np.argsort(-scores, kind="stable")
