"""Engine results -> response bodies. numpy arrays go to orjson as they are (it writes float32
arrays natively, far faster than lists of Python floats)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
from fastapi.responses import Response

from model.tokenizer import WordPieceTokenizer
from service.engine import ItemResult


def json_response(payload: dict, status_code: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status_code,
                    media_type="application/json", headers=headers)


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")


def encode_result(result: ItemResult, tokens: list[str], pooling: str, encoding_format: str) -> dict:
    vectors = result.vectors
    if encoding_format == "base64":
        value = [_b64(row) for row in vectors] if pooling == "none" else _b64(vectors)
    else:
        value = np.ascontiguousarray(vectors, dtype=np.float32)
    return {"tokens": tokens, "embeddings" if pooling == "none" else "embedding": value}


def fill_mask_result(result: ItemResult, input_ids: list[int], tokenizer: WordPieceTokenizer) -> dict:
    specials = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id}
    masks = []
    for mask in result.masks:
        predictions = []
        for token_id, score in zip(mask.token_ids.tolist(), mask.scores.tolist()):
            filled = [token_id if p == mask.position else t for p, t in enumerate(input_ids) if t not in specials]
            predictions.append({
                "token": token_id,
                "token_str": tokenizer.id_to_token(token_id),
                "score": score,
                # other masks stay visible as [MASK]; the filled one reads as text
                "sequence": tokenizer.decode(filled, skip_special_tokens=False),
            })
        masks.append({"position": mask.position, "predictions": predictions})
    return {"masks": masks}


def nsp_result(result: ItemResult) -> dict:
    logits = result.nsp_logits.astype(np.float64)
    shifted = np.exp(logits - logits.max())
    score = float(shifted[0] / shifted.sum())
    return {"is_next": score >= 0.5, "score": score, "logits": logits.tolist()}
