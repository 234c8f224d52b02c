"""Request and response bodies of `/token-vectors`: a ColBERT's vectors of each token, in query or document mode."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.frontend.schemas import Strict, Text


class TokenVectorsRequest(Strict):
    inputs: Text | list[Text] = Field(description="A text or a list of texts.",
                                      examples=[["how old is the eiffel tower?"]])
    mode: Literal["query", "document"] = Field(
        "document", description="query: [Q] marker, cut and filled with [MASK] to the model's query length, a vector "
                                "for every token; document: [D] marker, at most the document length, none for the "
                                "skiplist's tokens (punctuation).")
    truncate: bool = Field(False, description="Cut documents longer than the model's document length (as its encoder "
                                              "does) instead of answering 422.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="chunk: read a document longer than the document length in overlapping windows, each "
                              "marked as a document; its vectors are all of theirs, in order.")
    dtype: Literal["float32", "float16"] = Field("float32", description="The vectors' number format in the answer.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: each vector's little-endian bytes (of dtype), "
                             "base64-encoded.")


class TokenVectorsResult(BaseModel):
    tokens: list[str] = Field(description="The token each vector belongs to.")
    vectors: list[list[float]] | list[str]


class TokenVectorsUsage(BaseModel):
    input_tokens: int


class TokenVectorsResponse(BaseModel):
    model: str
    dim: int
    mode: Literal["query", "document"]
    dtype: Literal["float32", "float16"]
    results: list[TokenVectorsResult]
    usage: TokenVectorsUsage
