"""Request and response bodies of token classification and question answering (`service.frontend.routes_tokens`),
with the parameters and answer shapes of transformers' pipelines."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.frontend.schemas import Strict, Text

Strategy = Literal["none", "simple", "first", "average", "max"]


class EntityParameters(Strict):
    aggregation_strategy: Strategy = Field(
        "none", description="none: one entity per token; simple: adjacent tokens of one tag grouped; first, average, "
        "max: each word takes one label (its first piece's, its pieces' mean, its best piece's), then words are "
        "grouped (as transformers' token-classification pipeline).")
    ignore_labels: list[Text] | None = Field(None, description='Labels left out of the answer (default ["O"]).')
    stride: int | None = Field(
        None, description="Split texts longer than the model's window into windows overlapping by this many tokens "
        "(needs an aggregation_strategy other than none). Without it, a longer text is refused with 422.")


class TokenClassificationRequest(EntityParameters):
    inputs: Text | list[Text] = Field(description="A text or a list of texts.",
                                      examples=["Ada Lovelace worked with Charles Babbage in London ."])


class Entity(BaseModel):
    entity: str | None = Field(None, description="The token's label (aggregation_strategy none).")
    entity_group: str | None = Field(None, description="The group's tag, B-/I- removed (other strategies).")
    score: float
    index: int | None = Field(None, description="The token's index in its window ([CLS] is 0; strategy none).")
    word: str
    start: int = Field(description="Character offset of the entity in the input.")
    end: int


class TokenClassificationResponse(BaseModel):
    model: str
    results: list[list[Entity]] = Field(description="The entities of each input, in text order.")


class QuestionContext(Strict):
    question: Text
    context: Text


class AnswerParameters(Strict):
    top_k: int = Field(1, description="Answers per input, best first (1 to the server's max_top_k).")
    max_answer_len: int = Field(15, description="Longest answer, in tokens.")
    handle_impossible_answer: bool = Field(False, description="Let the empty answer (start = end = 0) compete.")
    doc_stride: int | None = Field(None, description="Overlap, in tokens, of the windows a long context is split into "
                                                     "(default min(max_seq_len / 2, 128)).")
    max_seq_len: int | None = Field(None, description="Tokens of each window, question included (default "
                                                      "min(the model's maximum, 384)).")
    max_question_len: int | None = Field(None, description="Accepted and ignored, as the pipeline's fast tokenizers "
                                                           "ignore it (the question is never cut).")
    align_to_words: bool = Field(True, description="Widen answers to whole words.")


class QuestionAnsweringRequest(AnswerParameters):
    inputs: QuestionContext | list[QuestionContext] = Field(
        description="A question with its context, or a list of them.",
        examples=[{"question": "Where did Ada live ?", "context": "Ada Lovelace lived in London ."}])


class Answer(BaseModel):
    answer: str = Field(description="The answer's text: context[start:end].")
    score: float
    start: int = Field(description="Character offsets of the answer in the context.")
    end: int


class QuestionAnsweringResponse(BaseModel):
    model: str
    results: list[list[Answer]] = Field(description="The best answers of each input, best first.")
