"""Request and response bodies: the API contract, with examples that appear in /docs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

Text = StrictStr  # numbers and nulls where text belongs are rejected, not coerced
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]


class Strict(BaseModel):
    # Unknown fields are a 422 naming them; no coercion (0 is not false, "5" is not 5), as the schema says.
    model_config = ConfigDict(extra="forbid", strict=True)


class EncodeRequest(Strict):
    inputs: Text | list[Text | Pair] = Field(
        description="A text, or a list of texts and [text_a, text_b] pairs (encoded as [CLS] a [SEP] b [SEP]).",
        examples=["a crane is flying", ["a crane is flying", ["the river", "flows to the sea"]]],
    )
    pooling: Literal["none", "cls", "mean"] = Field(
        "none", description="none: one vector per token (special tokens included); cls: the [CLS] vector; "
        "mean: the mean over the input's tokens.")
    normalize: bool = Field(False, description="Scale each returned vector to unit L2 norm.")
    truncate: bool = Field(False, description="Cut inputs longer than the model's maximum instead of answering 422.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: little-endian float32 bytes, row-major, base64-encoded.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="An input longer than the model's window: refuse (422, the default; truncate cuts it), or "
                              "chunk (pooled vectors only): read it in overlapping windows batched with everything "
                              "else, their pooled vectors averaged by their tokens (docs/long-inputs.md).")


class FillMaskRequest(Strict):
    inputs: Text | list[Text] = Field(
        description="Text(s) with one or more [MASK] tokens.", examples=["the cat sat on the [MASK] ."])
    top_k: int = Field(5, description="Predictions per mask, best first (1 to the server's max_top_k).")
    targets: list[Text] | None = Field(
        None, description="Only score these tokens (each must be one vocabulary token).", examples=[["mat", "floor"]])
    truncate: bool = Field(False, description="Cut inputs longer than the model's maximum instead of answering 422.")


class NspRequest(Strict):
    inputs: Pair | list[Pair] = Field(
        description="One [sentence_a, sentence_b] pair or a list of pairs.",
        examples=[["the storm grew stronger .", "it reached the coast on monday ."]],
    )
    truncate: bool = Field(False, description="Cut pairs longer than the model's maximum (longest first).")


class Usage(BaseModel):
    input_tokens: int


class TokenEmbeddings(BaseModel):
    tokens: list[str]
    embeddings: list[list[float]] | list[str] = Field(description="One vector per token (or base64 strings).")


class PooledEmbedding(BaseModel):
    tokens: list[str]
    embedding: list[float] | str


class EncodeResponse(BaseModel):
    model: str
    dim: int
    results: list[TokenEmbeddings | PooledEmbedding]
    usage: Usage


class Prediction(BaseModel):
    token: int
    token_str: str
    score: float
    sequence: str


class MaskPredictions(BaseModel):
    position: int = Field(description="Token index of the [MASK] in the encoded input ([CLS] is 0).")
    predictions: list[Prediction]


class FillMaskResult(BaseModel):
    masks: list[MaskPredictions]


class FillMaskResponse(BaseModel):
    model: str
    results: list[FillMaskResult]


class NspResult(BaseModel):
    is_next: bool
    score: float = Field(description="P(B follows A) = softmax(logits)[0].")
    logits: list[float] = Field(description="[is next, is random] (Hugging Face order).")


class NspResponse(BaseModel):
    model: str
    results: list[NspResult]


class ErrorBody(BaseModel):
    error: str = Field(description="What is wrong, naming the field or input.")
    error_type: Literal["validation", "unsupported", "unauthorized", "payload_too_large", "unsupported_media_type",
                        "overloaded", "unavailable", "not_found", "method_not_allowed", "internal"]


class Health(BaseModel):
    status: Literal["ok", "loading", "draining"]


class Liveness(BaseModel):
    status: Literal["alive"]
    state: Literal["loading", "ready", "draining"]


# ---- OpenAI-compatible embeddings (POST /v1/embeddings) --------------------------------------------


class OpenAIEmbeddingsRequest(Strict):
    input: Text | list[Text] | list[int] | list[list[int]] = Field(
        description="A text or a list of texts. Token-id arrays are refused: they would be ids of another "
                    "tokenizer (OpenAI clients count with tiktoken).", examples=["a crane is flying"])
    model: Text | None = Field(None, description="Accepted and echoed as the served model's name.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: little-endian float32 bytes (what the openai client asks for).")
    dimensions: int | None = Field(None, description="Keep the first N dimensions, then normalise (Matryoshka style); "
                                                     "1 to the model's width.")
    user: Text | None = Field(None, description="Accepted and ignored.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="Ours: an input longer than the model's window: refuse (400, the default), or "
                              "chunk: read it in overlapping windows batched with everything else, their pooled vectors "
                              "averaged by their tokens (docs/long-inputs.md).")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | str
    index: int


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail
