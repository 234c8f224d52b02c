"""The plain peer for token classification and question answering: a minimal FastAPI app around transformers,
one request at a time (no batching across requests), as tutorials deploy it.

    python -m bench.serving.task_peer NER_CHECKPOINT QA_CHECKPOINT PORT

/token-classification runs transformers' token-classification pipeline. transformers 5 has no question-answering
pipeline, so /question-answering runs the model on the pipeline's windows (384 tokens, stride 128) and takes the
best span by the same softmax product: the pipeline's cost without its Python post-processing, which flatters the peer.
"""

from __future__ import annotations

import sys

import torch
import transformers
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class TextsRequest(BaseModel):
    inputs: str | list[str]
    aggregation_strategy: str = "simple"


class QuestionContext(BaseModel):
    question: str
    context: str


class AnswerRequest(BaseModel):
    inputs: QuestionContext


def build(ner: str, qa: str) -> FastAPI:
    tagger = transformers.pipeline("token-classification", model=ner, tokenizer=ner, device="cpu")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(qa)
    answerer = transformers.BertForQuestionAnswering.from_pretrained(qa, dtype=torch.float32).eval()
    app = FastAPI()

    @app.post("/token-classification")
    def token_classification(body: TextsRequest):
        found = tagger(body.inputs, aggregation_strategy=body.aggregation_strategy)
        return {"results": [[{**e, "score": float(e["score"])} for e in found]]}

    @app.post("/question-answering")
    def question_answering(body: AnswerRequest):
        enc = tokenizer(body.inputs.question, body.inputs.context, truncation="only_second", max_length=384,
                        stride=128, return_overflowing_tokens=True, return_offsets_mapping=True, padding=True,
                        return_tensors="pt")
        offsets = enc.pop("offset_mapping")
        enc.pop("overflow_to_sample_mapping")
        with torch.no_grad():
            out = answerer(**enc)
        best = (0.0, 0, 0)
        for window in range(len(offsets)):
            context = torch.tensor([s == 1 for s in enc.sequence_ids(window)])
            start = out.start_logits[window].masked_fill(~context, -1e4).softmax(-1)
            end = out.end_logits[window].masked_fill(~context, -1e4).softmax(-1)
            spans = torch.triu(start[:, None] * end[None, :]).tril(14)
            score, flat = spans.flatten().max(0)
            if float(score) > best[0]:
                s, e = divmod(int(flat), spans.shape[1])
                best = (float(score), int(offsets[window][s][0]), int(offsets[window][e][1]))
        score, start, end = best
        return {"results": [[{"answer": body.inputs.context[start:end], "score": score, "start": start, "end": end}]]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    uvicorn.run(build(sys.argv[1], sys.argv[2]), host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
