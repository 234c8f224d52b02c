"""A ColBERT's token vectors: `POST /token-vectors`, each input's vectors as the model's own encoder gives them in query
or document mode (service.frontend.colbert). Its scores against a query are on the rerank routes."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.errors import ServiceError
from service.frontend.body import ParsedBodyRoute
from service.frontend.deps import ERRORS, Colbert, Model
from service.frontend.disconnects import client_gone
from service.frontend.outputs import json_response
from service.frontend.schemas import ErrorBody
from service.frontend.schemas_colbert import TokenVectorsRequest, TokenVectorsResponse

# 424: a checkpoint that is not a ColBERT (service.frontend.http_errors.TASK_HEAD_ROUTES)
colbert = APIRouter(route_class=ParsedBodyRoute, responses={**ERRORS, 424: {"model": ErrorBody}}, tags=["BERT"])


@colbert.post("/token-vectors", response_model=TokenVectorsResponse, summary="ColBERT token vectors")
async def token_vectors(body: TokenVectorsRequest, request: Request, door: Colbert, model: Model) -> Response:
    """Each input's projected, normalised token vectors in query or document mode (markers, [MASK] expansion,
    skiplist), as PyLate's and colbert-ai's encoders give them; float16 where asked."""
    if body.truncate and body.long_input == "chunk":
        raise ServiceError("validation", "send truncate: true or long_input: chunk, not both", param="long_input")
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    long_input = "chunk" if body.long_input == "chunk" else "truncate" if body.truncate else "refuse"
    outputs = await door.vectors(texts, body.mode, long_input, base64=body.encoding_format == "base64",
                                 gone=client_gone(request))
    dtype = np.dtype(np.float16 if body.dtype == "float16" else np.float32).newbyteorder("<")
    results = [{"tokens": o.tokens, "vectors": _encoded(o.vectors.astype(dtype), body.encoding_format)}
               for o in outputs]
    return json_response({"model": model.display_name, "dim": door.dim, "mode": body.mode, "dtype": body.dtype,
                          "results": results, "usage": {"input_tokens": sum(o.token_count for o in outputs)}})


def _encoded(vectors: np.ndarray, encoding_format: str):
    if encoding_format == "base64":
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    return vectors.astype(np.float32)  # float16 values, written as JSON numbers
