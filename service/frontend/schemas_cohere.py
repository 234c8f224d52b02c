"""Request and response bodies of Cohere's rerank routes, as its API reference and its Python SDK (`cohere`,
`RerankResponse`) have them: `POST /v1/rerank` (the `cohere.Client`) and `POST /v2/rerank` (`cohere.ClientV2`, which
LangChain's `CohereRerank` uses); Jina, vLLM and Infinity serve the same shape."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.frontend.schemas import Strict, Text


class CohereDocument(Strict):
    text: Text


class CohereRerankRequest(Strict):
    model: Text | None = Field(None, description="With several models served, which one ranks (a served name; "
                               "none: the default); with one, any name is answered by it.", examples=["bert-serve"])
    query: Text = Field(examples=["how old is the eiffel tower?"])
    documents: list[Text | CohereDocument] = Field(
        description="Texts, or objects with a `text` (Cohere's v1 form).",
        examples=[["it was built in 1889.", "paris is in france."]])
    top_n: int | None = Field(None, description="Return the best N (1 to the number of documents); all by default.")
    return_documents: bool = Field(False, description="Include each document's text in its result.")
    rank_fields: list[Text] | None = Field(None, description="Cohere v1: only [\"text\"] is read.")
    max_chunks_per_doc: int | None = Field(None, description="Cohere v1: not supported here (send long_input: chunk).")
    max_tokens_per_doc: int | None = Field(
        None, description="Cohere v2: documents longer than the model's window are cut to it when this is at least "
                          "the window; a smaller value is refused.")
    truncate: bool = Field(False, description="Ours: cut documents longer than the model's window instead of 400.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="Ours: chunk reads a ColBERT's documents longer than its window in overlapping windows.")


class CohereDocumentText(BaseModel):
    text: str


class CohereRerankResult(BaseModel):
    index: int
    relevance_score: float = Field(description="A cross-encoder's sigmoid(logit) (as /rerank's score); a ColBERT's "
                                               "MaxSim sum, 0 to its query length.")
    document: CohereDocumentText | None = None


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereRerankResult]
    meta: dict


class CohereError(BaseModel):
    message: str
