"""The root route as text-embeddings-inference and the Hugging Face Inference API serve it: `POST /` (and
`/invocations`, SageMaker's path), so that `huggingface_hub.InferenceClient(base_url=...)` and the tools
built on it (LangChain's HuggingFaceEndpointEmbeddings, Haystack's Hugging Face API embedders) work.

One checkpoint here can do several tasks (ours embed and fill masks), so the root picks one by a fixed
rule (`root_task`), then answers in the Hugging Face task's shape. The rule, in order:
1. `inputs` is `{source_sentence, sentences}` -> sentence-similarity (list of cosines);
2. `inputs` is `{text, text_pair}` -> text-classification of that pair;
3. `inputs` is `{question, context}` -> question-answering (`service.frontend.root_tokens`);
4. the `root_task` setting, when it names a task;
5. a classifier / cross-encoder checkpoint -> text-classification, and a token-classification checkpoint ->
   token-classification, unless the request carries only feature-extraction fields beside `inputs`
   (`normalize`, `dimensions`, `prompt_name`, ...: what huggingface_hub's feature_extraction sends; its
   text_classification and token_classification always send `parameters`);
6. every text holds [MASK], or `parameters` has `top_k` or `targets` -> fill-mask (needs the MLM head);
7. otherwise -> feature-extraction (pooled vectors, as /embed).
A request the rule cannot place (some texts with [MASK] and some without; an `inputs` object of another
task) gets 422 saying which explicit route to call.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from model.tokenizer import MASK
from service.errors import ServiceError
from service.frontend import root_tokens
from service.frontend.frontdoor import FrontDoor
from service.frontend.inputs import is_pair, preparation
from service.frontend.outputs import json_response, labelled
from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.deps import TEI_ERRORS, Door, Model
from service.frontend.schemas import Strict, Text
from service.frontend.schemas_tei import Direction, TeiInput, TeiSimilarityRequest

root = APIRouter(route_class=ParsedBodyRoute, responses=TEI_ERRORS, tags=["Hugging Face Inference API"])
EXPLICIT = ("call the explicit route instead: /embed, /fill-mask, /similarity, /predict, /token-classification or "
            "/question-answering")


class EmbedParameters(Strict):
    normalize: bool = True
    truncate: bool | None = False
    truncation_direction: Direction = "right"
    prompt_name: Text | None = None
    dimensions: int | None = None
    encoding_format: Literal["float"] | None = None  # base64 vectors: /v1/embeddings


class RootEmbedRequest(EmbedParameters):
    """feature-extraction: huggingface_hub sends the parameters beside `inputs`; older clients inside `parameters`."""
    inputs: TeiInput
    parameters: EmbedParameters | None = None


class FillMaskParameters(Strict):
    top_k: int = 5
    targets: list[Text] | Text | None = None


class RootFillMaskRequest(Strict):
    inputs: Text | list[Text]
    parameters: FillMaskParameters | None = None
    truncate: bool | None = False


class TextPair(Strict):
    text: Text
    text_pair: Text | None = None


class ClassifyParameters(Strict):
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None
    top_k: int | None = None


class RootClassifyRequest(Strict):
    inputs: Text | list[Text] | TextPair | list[TextPair]
    parameters: ClassifyParameters | None = None
    truncate: bool | None = False
    truncation_direction: Direction = "right"
    raw_scores: bool = False


def root_task(body: dict, door: FrontDoor, default: str) -> str:
    """Which task a root request asks for (see the module docstring for the rule)."""
    inputs = body.get("inputs")
    if isinstance(inputs, dict):
        if "source_sentence" in inputs or "sentences" in inputs:
            return "sentence-similarity"
        if "text" in inputs:
            return "text-classification"
        if "question" in inputs or "context" in inputs:
            return "question-answering"
        raise ServiceError("validation", f"inputs is an object with fields {sorted(inputs)}, which no task of the root "
                                         f"route takes ({{source_sentence, sentences}}, {{text, text_pair}} or "
                                         f"{{question, context}}); {EXPLICIT}", param="inputs")
    if default != "auto":
        return default
    if door.num_labels or door.num_token_labels:
        embedding_only = set(EmbedParameters.model_fields) - {"truncate", "truncation_direction"}
        asks_embedding = "parameters" not in body and bool(embedding_only & set(body))
        task = "text-classification" if door.num_labels else "token-classification"
        return "feature-extraction" if asks_embedding else task
    texts = [inputs] if isinstance(inputs, str) else inputs if isinstance(inputs, list) else []
    masked = [isinstance(t, str) and MASK in t for t in texts]
    parameters = body.get("parameters")
    asks_fill_mask = isinstance(parameters, dict) and bool({"top_k", "targets"} & set(parameters))
    if door.has_mlm_head and (any(masked) or asks_fill_mask):
        if any(masked) and not all(masked):
            raise ServiceError("validation", f"some inputs hold {MASK} and some do not, so the root route cannot tell "
                                             f"fill-mask from feature-extraction; {EXPLICIT}", param="inputs")
        return "fill-mask"
    return "feature-extraction"


def _parse(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


async def _feature_extraction(body: dict, request: Request, door: FrontDoor, model) -> list:
    req = _parse(RootEmbedRequest, body)
    params = req.parameters or req
    prep = preparation(model.checkpoint.pooling, params.truncate, params.truncation_direction, params.prompt_name)
    outputs = await door.encode(req.inputs, model.checkpoint.pooling.mode, params.normalize, prep,
                                gone=client_gone(request), dimensions=params.dimensions)
    return [o.result.vector for o in outputs]


async def _fill_mask(body: dict, request: Request, door: FrontDoor, model) -> list:
    req = _parse(RootFillMaskRequest, body)
    params = req.parameters or FillMaskParameters()
    targets = [params.targets] if isinstance(params.targets, str) else params.targets
    per_input = await door.fill_mask(req.inputs, params.top_k, targets, bool(req.truncate), gone=client_gone(request))
    answers = []
    for masks in per_input:  # Hugging Face's shape: a list per mask only when an input has several
        lists = [[{"score": p.score, "token": p.token_id, "token_str": p.token, "sequence": p.sequence}
                  for p in mask.predictions] for mask in masks]
        answers.append(lists[0] if len(lists) == 1 else lists)
    return answers[0] if isinstance(req.inputs, str) else answers


async def _sentence_similarity(body: dict, request: Request, door: FrontDoor, model) -> list:
    req = _parse(TeiSimilarityRequest, body)
    params = req.parameters
    prep = preparation(model.checkpoint.pooling, params and params.truncate,
                       params.truncation_direction if params else "right", params and params.prompt_name)
    return await door.similarity(req.inputs.source_sentence, req.inputs.sentences, model.checkpoint.pooling.mode,
                                 prep, gone=client_gone(request))


async def _text_classification(body: dict, request: Request, door: FrontDoor, model) -> list:
    req = _parse(RootClassifyRequest, body)
    inputs = req.inputs if isinstance(req.inputs, list) and not is_pair(req.inputs) else [req.inputs]
    entries = [[x.text, x.text_pair] if isinstance(x, TextPair) and x.text_pair is not None else
               x.text if isinstance(x, TextPair) else x for x in inputs]
    prep = preparation(model.checkpoint.pooling, req.truncate, req.truncation_direction)
    logits = await door.classify(entries, prep, gone=client_gone(request))
    spec, params = model.checkpoint.labels, req.parameters or ClassifyParameters()
    chosen = params.function_to_apply
    results = []
    for row in logits:
        if req.raw_scores or chosen == "none":
            scores = np.asarray(row, dtype=np.float64)
        elif chosen is not None:
            scores = type(spec)(spec.labels, spec.problem_type, chosen).scores(row)
        else:
            scores = spec.scores(row)
        ranked = labelled(scores, spec.labels)
        results.append(ranked[: params.top_k] if params.top_k else ranked)
    return results  # a list per input, as the Inference API answers (huggingface_hub reads the first)


TASKS = {"feature-extraction": _feature_extraction, "fill-mask": _fill_mask,
         "sentence-similarity": _sentence_similarity, "text-classification": _text_classification,
         "token-classification": root_tokens.token_classification, "question-answering": root_tokens.question_answering}
ROOT_BODY = Body(openapi_examples={
    "feature-extraction": {"value": {"inputs": ["a crane is flying"], "normalize": True}},
    "fill-mask": {"value": {"inputs": "the capital of france is [MASK] .", "parameters": {"top_k": 3}}},
    "sentence-similarity": {"value": {"inputs": {"source_sentence": "a crane is flying",
                                                 "sentences": ["a bird in the sky", "the river flows"]}}},
    "text-classification": {"value": {"inputs": {"text": "how old is the tower?", "text_pair": "built in 1889."}}},
    "token-classification": {"value": {"inputs": "Ada Lovelace lived in London .",
                                       "parameters": {"aggregation_strategy": "simple"}}},
    "question-answering": {"value": {"inputs": {"question": "Where did Ada live ?",
                                                "context": "Ada Lovelace lived in London ."}}},
})


async def answer(body: dict, request: Request, door: FrontDoor, model) -> Response:
    task = root_task(body, door, model.spec.root_task)
    return json_response(await TASKS[task](body, request, door, model), headers={"X-Task": task})


@root.post("/", summary="The Hugging Face Inference API / TEI root route")
async def inference(request: Request, door: Door, model: Model, body: dict[str, Any] = ROOT_BODY) -> Response:
    """Answers the task the request's shape implies (feature-extraction, fill-mask, sentence-similarity,
    text-classification, token-classification, question-answering) in the Hugging Face task's shape; the response
    header X-Task names it."""
    return await answer(body, request, door, model)


@root.post("/invocations", summary="SageMaker's path for the root route")
async def invocations(request: Request, door: Door, model: Model, body: dict[str, Any] = ROOT_BODY) -> Response:
    """The same as POST /."""
    return await answer(body, request, door, model)
