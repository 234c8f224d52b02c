"""Request and response bodies of the text-embeddings-inference-compatible routes, field by field as
TEI's OpenAPI document has them (`docs/openapi.json`, `router/src/http/types.rs` in its repository),
and of the Hugging Face Inference API tasks the root route answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.frontend.schemas import Pair, Strict, Text

# TEI's `Input`: a text, token ids of the served tokenizer, or a list of either.
TokenIds = list[int]
TeiInput = Text | TokenIds | list[Text | TokenIds]
Direction = Literal["right", "left", "Right", "Left"]  # TEI writes Right/Left; huggingface_hub sends right/left

INPUTS = Field(description="A text, a list of token ids of this server's tokenizer (as /tokenize returns them: "
                           "[CLS] and [SEP] included, nothing is added), or a list of either.",
               examples=["a crane is flying"])
TRUNCATE = Field(False, description="Cut inputs longer than the model's maximum instead of answering 422.")
DIRECTION = Field("right", description="Which end truncate cuts: right keeps the start of a text, left its end.")
PROMPT = Field(None, description="A prompt of the checkpoint's sentence-transformers config, put before each text "
                                 "(422 naming the known prompts otherwise). Without it the config's default applies.")


class TeiEmbedRequest(Strict):
    inputs: TeiInput = INPUTS
    normalize: bool = Field(True, description="Scale each vector to unit length.")
    truncate: bool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: Text | None = PROMPT
    dimensions: int | None = Field(None, description="Keep the first N dimensions, then normalise (Matryoshka); "
                                                     "1 to the model's width.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="Ours: an input longer than the model's window: refuse (422, the default; truncate "
                              "cuts it), or chunk: read it in overlapping windows batched with everything else, their "
                              "pooled vectors averaged by their tokens (docs/long-inputs.md).")


class TeiEmbedAllRequest(Strict):
    inputs: TeiInput = INPUTS
    truncate: bool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: Text | None = PROMPT


class TeiEmbedSparseRequest(TeiEmbedAllRequest):
    pass


class TeiTokenizeRequest(Strict):
    inputs: Text | list[Text] = Field(description="A text or a list of texts.", examples=["a crane is flying"])
    add_special_tokens: bool = Field(True, description="Add [CLS] and [SEP].")
    prompt_name: Text | None = PROMPT


class TeiDecodeRequest(Strict):
    ids: TokenIds | list[TokenIds] = Field(description="Token ids, or a list of them.", examples=[[101, 7592, 102]])
    skip_special_tokens: bool = Field(True, description="Leave [CLS], [SEP], [PAD] out of the text.")


class SimilarityInput(Strict):
    source_sentence: Text = Field(examples=["a crane is flying"])
    sentences: list[Text] = Field(examples=[["a bird in the sky", "the river flows to the sea"]])


class SimilarityParameters(Strict):
    truncate: bool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    prompt_name: Text | None = PROMPT


class TeiSimilarityRequest(Strict):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


# TEI's PredictInput: a text, a [text, text_pair] pair, or a list of texts and pairs. A list of exactly two
# texts is one pair (TEI reads it so).
PredictInput = Text | Pair | list[Text | Pair]


class TeiPredictRequest(Strict):
    inputs: PredictInput = Field(description="A text, a [text, text_pair] pair, or a list of texts and pairs "
                                             "(a list of exactly two texts is one pair, as in TEI).",
                                 examples=["what a lovely day", ["how old is the tower?", "it was built in 1889."]])
    truncate: bool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    raw_scores: bool = Field(False, description="Return the logits instead of softmax/sigmoid scores.")


class TeiRerankRequest(Strict):
    query: Text = Field(examples=["how old is the eiffel tower?"])
    texts: list[Text] = Field(examples=[["it was built in 1889.", "paris is in france."]])
    truncate: bool | None = TRUNCATE
    truncation_direction: Direction = DIRECTION
    raw_scores: bool = Field(False, description="Return the logit instead of sigmoid(logit) (a cross-encoder's).")
    return_text: bool = Field(False, description="Include each text in the answer.")
    long_input: Literal["refuse", "chunk"] = Field(
        "refuse", description="Ours: chunk reads a ColBERT's texts longer than its document length in overlapping "
                              "windows (their vectors together score the text).")


class TeiToken(BaseModel):
    id: int
    text: str = Field(description="The input's characters for a word piece; the token itself for a special token.")
    special: bool
    start: int | None = Field(description="Character offset where the piece starts (null for special tokens).")
    stop: int | None


class TeiSparseValue(BaseModel):
    index: int
    value: float


class TeiPrediction(BaseModel):
    score: float
    label: str


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TeiError(BaseModel):
    error: str
    # TEI's ErrorType, spelled as its server sends it (service.frontend.http_errors maps our kinds onto it)
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]
