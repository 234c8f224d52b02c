"""HTTP routes of our own API: JSON -> the front door -> JSON. Nothing else happens here."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.frontend.body import ParsedBodyRoute
from service.frontend.deps import ERRORS, Door, Model, State, request_model
from service.frontend.disconnects import client_gone
from service.frontend.inputs import Preparation
from service.frontend.outputs import encode_result, fill_mask_result, json_response, nsp_result
from service.frontend.schemas import (
    EncodeRequest,
    EncodeResponse,
    ErrorBody,
    FillMaskRequest,
    FillMaskResponse,
    Health,
    Liveness,
    NspRequest,
    NspResponse,
)

api = APIRouter(route_class=ParsedBodyRoute, responses=ERRORS, tags=["BERT"])
public = APIRouter(tags=["Operations"])


@api.post("/encode", response_model=EncodeResponse, summary="Contextual token embeddings")
async def encode(body: EncodeRequest, request: Request, door: Door, model: Model) -> Response:
    """The encoder's last hidden layer (or the checkpoint's `embedding_layer`): one vector per token (special tokens
    included), or pooled by [CLS] or mean."""
    prep = Preparation(body.truncate, chunk=body.long_input == "chunk")
    outputs = await door.encode(body.inputs, body.pooling, body.normalize, prep,
                                gone=client_gone(request), base64=body.encoding_format == "base64")
    return json_response({
        "model": model.display_name,
        "dim": model.checkpoint.config.hidden_size,
        "results": [encode_result(o, body.encoding_format) for o in outputs],
        "usage": {"input_tokens": sum(o.token_count for o in outputs)},
    })


@api.post("/fill-mask", response_model=FillMaskResponse, summary="Masked-token fill-in")
async def fill_mask(body: FillMaskRequest, request: Request, door: Door, model: Model) -> Response:
    """Top-k tokens for every [MASK], scored by softmax over the whole vocabulary (as the Hugging Face pipeline)."""
    outputs = await door.fill_mask(body.inputs, body.top_k, body.targets, body.truncate, gone=client_gone(request))
    return json_response({"model": model.display_name, "results": [fill_mask_result(o) for o in outputs]})


@api.post("/nsp", response_model=NspResponse, summary="Next-sentence scores")
async def nsp(body: NspRequest, request: Request, door: Door, model: Model) -> Response:
    """P(B follows A) for each [A, B] pair; logits in Hugging Face order (index 0 = is next)."""
    outputs = await door.nsp(body.inputs, body.truncate, gone=client_gone(request))
    return json_response({"model": model.display_name, "results": [nsp_result(o) for o in outputs]})


@api.get("/info", summary="Model, device and limits")
async def info(request: Request, state: State) -> Response:
    """The served model's config and training metrics, the device and dtype, and every limit (the default model's,
    or under /models/{name} that model's), and a summary of every served model."""
    return json_response(state.info(request_model(request)))


@public.get("/health", response_model=Health, responses={503: {"model": ErrorBody}}, summary="Readiness")
async def health(state: State) -> Response:
    """200 once the model is loaded and warmed up; 503 while loading, while shutting down, and while the engine
    cannot compute (dead or stuck: the error says why)."""
    return json_response(state.health())


@public.get("/live", response_model=Liveness, responses={503: {"model": ErrorBody}}, summary="Liveness")
async def live(state: State) -> Response:
    """200 while the process can still make progress: loading, ready (however busy) or draining. 503 when it cannot
    (the model failed to load, a batching thread or the engine process died, or the engine has had work and
    finished nothing for stall_timeout_s): restart it. Readiness is /health."""
    return json_response(state.live())


@public.get("/metrics", summary="Prometheus metrics",
            response_class=Response)
async def metrics(state: State) -> Response:
    """Requests and failures by route and kind, queue depth and time, inference time, batch sizes, padding."""
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
