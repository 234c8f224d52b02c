"""Sequence classifiers and rerankers, on text-embeddings-inference's routes: `/predict` (texts and
[text, text_pair] pairs -> labels with scores) and `/rerank` (a query against texts, best first). Scores
come from the checkpoint's classification head through the same batcher as every other route; softmax
or sigmoid as its config says (`model.labels`), or the logits with `raw_scores`. /rerank scores with whatever the
model reranks with (service.frontend.rerankers: a cross-encoder, or a ColBERT by MaxSim)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.frontend.inputs import is_pair, preparation
from service.frontend.outputs import json_response, labelled
from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.deps import TEI_ERRORS, Door, Model, Reranking
from service.frontend.rerankers import RerankOptions, best_first
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
async def rerank(body: TeiRerankRequest, request: Request, reranker: Reranking, model: Model) -> Response:
    """Each text's relevance to the query, sorted best first, with each text's index: a cross-encoder's score of
    (query, text), or a ColBERT's MaxSim score."""
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction)
    options = RerankOptions(prep, raw_scores=body.raw_scores, chunk=body.long_input == "chunk", field="texts")
    scores = await reranker.scores(body.query, body.texts, options, gone=client_gone(request))
    ranks = [{"index": int(i), "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text else {})}
             for i in best_first(scores)]
    return json_response(ranks)
