"""HTTP routes: JSON -> work items -> batcher -> JSON. Nothing else happens here."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from service.inputs import encode_items, fill_mask_items, nsp_items
from service.outputs import encode_result, fill_mask_result, json_response, nsp_result
from service.schemas import (
    EncodeRequest,
    EncodeResponse,
    ErrorBody,
    FillMaskRequest,
    FillMaskResponse,
    Health,
    NspRequest,
    NspResponse,
)
from service.state import ServiceState, get_state, require_api_key, require_metrics_key

State = Annotated[ServiceState, Depends(get_state)]
ERRORS = {code: {"model": ErrorBody} for code in (401, 413, 415, 422, 429, 500, 501, 503)}

api = APIRouter(dependencies=[Depends(require_api_key)], responses=ERRORS)
public = APIRouter()


@api.post("/encode", response_model=EncodeResponse, summary="Contextual token embeddings")
async def encode(body: EncodeRequest, request: Request, state: State) -> Response:
    """The encoder's last hidden layer: one vector per token (special tokens included), or pooled by [CLS] or mean."""
    state.require_ready()
    items, tokens = await state.tokenize(encode_items, body.inputs, body.pooling, body.normalize, body.truncate)
    results = await state.compute(request, items)
    return json_response({
        "model": state.model_name,
        "dim": state.hidden_size,
        "results": [encode_result(r, t, body.pooling, body.encoding_format) for r, t in zip(results, tokens)],
        "usage": {"input_tokens": sum(len(i) for i in items)},
    })


@api.post("/fill-mask", response_model=FillMaskResponse, summary="Masked-token fill-in")
async def fill_mask(body: FillMaskRequest, request: Request, state: State) -> Response:
    """Top-k tokens for every [MASK], scored by softmax over the whole vocabulary (as the Hugging Face pipeline)."""
    state.require_ready()
    state.require_head("mlm")
    items, ids = await state.tokenize(fill_mask_items, body.inputs, body.top_k, body.targets, body.truncate)
    results = await state.compute(request, items)
    tokenizer = state.tokenizer
    return json_response({"model": state.model_name,
                      "results": [fill_mask_result(r, i, tokenizer) for r, i in zip(results, ids)]})


@api.post("/nsp", response_model=NspResponse, summary="Next-sentence scores")
async def nsp(body: NspRequest, request: Request, state: State) -> Response:
    """P(B follows A) for each [A, B] pair; logits in Hugging Face order (index 0 = is next)."""
    state.require_ready()
    state.require_head("nsp")
    items = await state.tokenize(nsp_items, body.inputs, body.truncate)
    results = await state.compute(request, items)
    return json_response({"model": state.model_name, "results": [nsp_result(r) for r in results]})


@api.get("/info", summary="Model, device and limits")
async def info(state: State) -> Response:
    """The served model's config and training metrics, the device and dtype, and every limit."""
    return json_response(state.info())


@public.get("/health", response_model=Health, responses={503: {"model": ErrorBody}}, summary="Readiness")
async def health(state: State) -> Response:
    """200 once the model is loaded and warmed up; 503 while loading and while shutting down."""
    state.require_ready()
    return json_response({"status": "ok"})


@public.get("/metrics", dependencies=[Depends(require_metrics_key)], summary="Prometheus metrics",
            response_class=Response)
async def metrics(state: State) -> Response:
    """Requests and failures by route and kind, queue depth and time, inference time, batch sizes, padding."""
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
