"""Front-door outputs -> response bodies. numpy arrays go to orjson as they are (it writes float32
arrays natively, far faster than lists of Python floats)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
from starlette.responses import Response

from service.frontend.frontdoor import EncodeOutput, MaskOutput, NspOutput
from service.tasks import TokenVectors


def json_response(payload: dict | list, status_code: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status_code,
                    media_type="application/json", headers=headers)


def b64_floats(array: np.ndarray) -> str:
    """Little-endian float32 bytes, row-major, base64-encoded."""
    return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")


def encode_result(output: EncodeOutput, encoding_format: str) -> dict:
    result = output.result
    if isinstance(result, TokenVectors):
        vectors = result.vectors
        value = [b64_floats(row) for row in vectors] if encoding_format == "base64" else \
            np.ascontiguousarray(vectors, dtype=np.float32)
        return {"tokens": output.tokens, "embeddings": value}
    value = b64_floats(result.vector) if encoding_format == "base64" else np.ascontiguousarray(result.vector, np.float32)
    return {"tokens": output.tokens, "embedding": value}


def fill_mask_result(masks: list[MaskOutput]) -> dict:
    return {"masks": [{"position": mask.position, "predictions": [
        {"token": p.token_id, "token_str": p.token, "score": p.score, "sequence": p.sequence}
        for p in mask.predictions]} for mask in masks]}


def nsp_result(output: NspOutput) -> dict:
    return {"is_next": output.is_next, "score": output.score, "logits": output.logits}


def labelled(scores: np.ndarray, labels: tuple[str, ...]) -> list[dict]:
    """[{score, label}] for one input of a classifier, best first."""
    order = np.argsort(-scores, kind="stable")
    return [{"score": float(scores[i]), "label": labels[i]} for i in order]
