"""Sequence classifiers and cross-encoders, on text-embeddings-inference's routes: `/predict` (texts and
[text, text_pair] pairs -> labels with scores) and `/rerank` (a query against texts, best first). Scores
come from the checkpoint's classification head through the same batcher as every other route; softmax
or sigmoid as its config says (`model.labels`), or the logits with `raw_scores`."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.errors import ServiceError
from service.frontend.inputs import is_pair, preparation
from service.frontend.outputs import json_response, labelled
from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.deps import TEI_ERRORS, Door, Model
from service.frontend.schemas_tei import TeiPrediction, TeiPredictRequest, TeiRank, TeiRerankRequest

classify = APIRouter(route_class=ParsedBodyRoute, responses=TEI_ERRORS, tags=["TEI-compatible"])


@classify.post("/predict", response_model=list[TeiPrediction] | list[list[TeiPrediction]],
               summary="Classify texts or pairs (TEI-compatible)")
async def predict(body: TeiPredictRequest, request: Request, door: Door, model: Model) -> Response:
    """Every label's score for each text or [text, text_pair] pair, best first; one list per input for a batch."""
    single = isinstance(body.inputs, str) or is_pair(body.inputs)
    entries = [body.inputs] if single else list(body.inputs)
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction)
    logits = await door.classify(entries, prep, gone=client_gone(request))
    spec = model.checkpoint.labels
    results = [labelled(spec.scores(row, raw=body.raw_scores), spec.labels) for row in logits]
    return json_response(results[0] if single else results)


@classify.post("/rerank", response_model=list[TeiRank], summary="Rerank texts against a query (TEI-compatible)")
async def rerank(body: TeiRerankRequest, request: Request, door: Door, model: Model) -> Response:
    """The cross-encoder's score of (query, text) for every text, sorted best first, with each text's index."""
    if door.num_labels and not door.classifier_pairs:
        raise ServiceError("unsupported", f"/rerank needs a cross-encoder (a classifier of [query, text] pairs); this "
                                          f"checkpoint's classifier reads single texts. It has: {door.heads()}")
    if door.num_labels > 1:
        raise ServiceError("unsupported", f"/rerank needs one relevance score per pair; this checkpoint's classifier "
                                          f"has {door.num_labels} outputs (use /predict)")
    if not body.texts:
        raise ServiceError("empty", "texts is empty; send at least one text to rank", param="texts")
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction)
    door.check_query(body.query, prep)
    logits = await door.classify([[body.query, text] for text in body.texts], prep, gone=client_gone(request),
                                 field="texts")
    scores = model.checkpoint.labels.scores(np.stack(logits)[:, 0], raw=body.raw_scores)
    ranks = [{"index": int(i), "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text else {})}
             for i in np.argsort(-scores, kind="stable")]
    return json_response(ranks)
