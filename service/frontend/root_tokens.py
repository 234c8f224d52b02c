"""The root route's token-classification and question-answering tasks (`service.frontend.routes_root` picks the
task), in the shapes of the Hugging Face Inference API, which huggingface_hub's `InferenceClient.token_classification`
and `.question_answering` read: a list of entities for a text (a list per text for several), and one answer
object (a list of them when there are several, as the pipeline answers)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from service.frontend.disconnects import client_gone
from service.frontend.frontdoor import FrontDoor
from service.frontend.routes_tokens import answer_options, entity_options
from service.frontend.schemas import Strict, Text
from service.frontend.schemas_tokens import AnswerParameters, EntityParameters, QuestionContext, Strategy
from service.frontend.token_tasks import answer_questions, classify_tokens

# The Inference API groups entities unless told otherwise (huggingface_hub's documented outputs carry entity_group);
# our own route keeps the pipeline's default, none.
ROOT_STRATEGY = "simple"


class RootEntityParameters(EntityParameters):
    aggregation_strategy: Strategy | None = None


class RootTokenClassificationRequest(Strict):
    inputs: Text | list[Text]
    parameters: RootEntityParameters | None = None


class RootQuestionAnsweringRequest(Strict):
    inputs: QuestionContext | list[QuestionContext]
    parameters: AnswerParameters | None = None


def _parse(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


async def token_classification(body: dict, request: Request, door: FrontDoor, state) -> list:
    req = _parse(RootTokenClassificationRequest, body)
    texts = [req.inputs] if isinstance(req.inputs, str) else list(req.inputs)
    labels = state.checkpoint.labels.labels if state.checkpoint.labels is not None else ()
    options = entity_options(req.parameters or RootEntityParameters(), ROOT_STRATEGY)
    results = await classify_tokens(door, texts, labels, options, gone=client_gone(request))
    return results[0] if isinstance(req.inputs, str) else results


async def question_answering(body: dict, request: Request, door: FrontDoor, state) -> list | dict:
    req = _parse(RootQuestionAnsweringRequest, body)
    inputs = req.inputs if isinstance(req.inputs, list) else [req.inputs]
    options, windowing = answer_options(req.parameters or AnswerParameters())
    results = await answer_questions(door, [(x.question, x.context) for x in inputs], options, windowing,
                                     gone=client_gone(request))
    shaped = [found[0] if len(found) == 1 else found for found in results]
    return shaped if isinstance(req.inputs, list) else shaped[0]
