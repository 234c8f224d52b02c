"""The naive peer: what most tutorials deploy. A minimal FastAPI app that runs `transformers.BertModel`
once per request (no batching), mean-pooled, on the same checkpoint.

    python -m bench.serving.naive_peer CHECKPOINT PORT
"""

from __future__ import annotations

import sys

import torch
import transformers
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class EncodeRequest(BaseModel):
    inputs: str | list[str]
    pooling: str = "mean"
    truncate: bool = True


def build(checkpoint: str) -> FastAPI:
    tokenizer = transformers.BertTokenizerFast.from_pretrained(checkpoint)
    # float32 whatever the saved dtype: transformers would otherwise keep a half-precision checkpoint in float16,
    # which is slow on CPU and not the precision the report compares
    model = transformers.BertModel.from_pretrained(checkpoint, dtype=torch.float32).eval()
    app = FastAPI()

    @app.post("/encode")
    def encode(body: EncodeRequest):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        with torch.no_grad():
            enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1)
            pooled = (hidden * mask).sum(1) / mask.sum(1)
        return {"results": [{"embedding": row.tolist()} for row in pooled]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    uvicorn.run(build(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
