"""Token classification (named entities, part of speech) and extractive question answering: `/token-classification`
and `/question-answering`, answering as transformers' pipelines do, batched with every other route's work
(`service.frontend.token_tasks`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.outputs import json_response
from service.frontend.deps import ERRORS, Door, Model
from service.frontend.schemas import ErrorBody
from service.frontend.schemas_tokens import (
    QuestionAnsweringRequest,
    QuestionAnsweringResponse,
    TokenClassificationRequest,
    TokenClassificationResponse,
)
from service.frontend.token_tasks import AnswerOptions, EntityOptions, WindowOptions, answer_questions, classify_tokens

# 424: a checkpoint without the route's head (service.frontend.http_errors.TASK_HEAD_ROUTES)
tokens = APIRouter(route_class=ParsedBodyRoute, responses={**ERRORS, 424: {"model": ErrorBody}}, tags=["BERT"])


def entity_options(params, default_strategy: str = "none") -> EntityOptions:
    ignore = ("O",) if params.ignore_labels is None else tuple(params.ignore_labels)
    return EntityOptions(params.aggregation_strategy or default_strategy, ignore, params.stride)


def answer_options(params) -> tuple[AnswerOptions, WindowOptions]:
    return (AnswerOptions(params.top_k, params.max_answer_len, params.handle_impossible_answer, params.align_to_words),
            WindowOptions(params.max_seq_len, params.doc_stride))


@tokens.post("/token-classification", response_model=TokenClassificationResponse,
             summary="Token classification (named entities)")
async def token_classification(body: TokenClassificationRequest, request: Request, door: Door, model: Model
                               ) -> Response:
    """Each text's entities with their character offsets, from the checkpoint's token-classification head."""
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    labels = model.checkpoint.labels.labels if model.checkpoint.labels is not None else ()
    results = await classify_tokens(door, texts, labels, entity_options(body), gone=client_gone(request))
    return json_response({"model": model.display_name, "results": results})


@tokens.post("/question-answering", response_model=QuestionAnsweringResponse,
             summary="Extractive question answering")
async def question_answering(body: QuestionAnsweringRequest, request: Request, door: Door, model: Model) -> Response:
    """The best spans of each context that answer its question, from the checkpoint's question-answering head;
    contexts longer than the window are read in overlapping windows."""
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    options, windowing = answer_options(body)
    results = await answer_questions(door, [(x.question, x.context) for x in inputs], options, windowing,
                                     gone=client_gone(request))
    return json_response({"model": model.display_name, "results": results})
