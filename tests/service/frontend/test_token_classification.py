"""Token classification (a BertForTokenClassification checkpoint written by transformers) answers as transformers'
own token-classification pipeline does on the same checkpoint: every aggregation strategy, ignore_labels, long
texts split with stride, character offsets into texts with accents, CJK, emoji and words of several pieces;
texts batched together answer as each alone; bad input gets a 4xx naming the problem."""

from __future__ import annotations

import unicodedata

import pytest
import transformers

from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
# The last text's combining accents and ligature change length in the normalizer, which is how the pipeline tells a
# word's first piece from the others.
TEXTS = ["Ada Lovelace lived in London with Charles Babbage .",
         "Zoë Saldaña visited Zürich, Malmö and São Paulo in 2019 .",
         "東京 is the capital of 日本 , said 李明 🙂 today !",
         "Unbelievably, the counterrevolutionaries reorganized everything overnight .",
         "The Cafe\u0301 of Zoe\u0308 in Ko\u0308ln , naïve but ﬁne , by E\u0301cole and A\u0301lvaro in "
         "O\u0308sterreich ."]
LONG = " ".join(["The river flows past the old mill towards the harbour where Marie waited ."] * 14)


def plain(text: str) -> str:
    """Text as an uncased BERT vocabulary spells it: lower case, accents and ligatures taken apart."""
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


def pipeline(directory):
    return transformers.pipeline("token-classification", model=str(directory), tokenizer=str(directory), device="cpu")


def assert_same(ours: list[dict], reference: list[dict], text: str) -> None:
    assert [(e.get("entity"), e.get("entity_group"), e["word"], e["start"], e["end"]) for e in ours] == \
        [(e.get("entity"), e.get("entity_group"), e["word"], e["start"], e["end"]) for e in reference], text
    for mine, theirs in zip(ours, reference):
        assert mine["score"] == pytest.approx(float(theirs["score"]), abs=1e-4)
        assert mine.get("index") == theirs.get("index")


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
async def test_every_strategy_equals_the_pipeline_batched_and_alone(tiny_token_classifier, strategy):
    reference = pipeline(tiny_token_classifier)
    async with serving(tiny_token_classifier) as client:
        batched = await client.post("/token-classification", json={"inputs": TEXTS, "aggregation_strategy": strategy})
        alone = [(await client.post("/token-classification", json={"inputs": t, "aggregation_strategy": strategy}))
                 .json()["results"][0] for t in TEXTS]
    assert batched.status_code == 200, batched.text
    results = batched.json()["results"]
    for text, ours, single in zip(TEXTS, results, alone):
        assert_same(ours, reference(text, aggregation_strategy=strategy), text)
        assert_same(single, ours, text)
    assert any(results), "the random head labels nothing but O: the comparison would be empty"


async def test_offsets_point_at_the_text(tiny_token_classifier):
    """Each token's offsets cover the characters its piece came from ([UNK] keeps the text itself)."""
    async with serving(tiny_token_classifier) as client:
        found = (await client.post("/token-classification", json={"inputs": TEXTS, "ignore_labels": []})).json()
    for text, entities in zip(TEXTS, found["results"]):
        assert entities, text
        for entity in entities:
            source = text[entity["start"] : entity["end"]]
            assert plain(source) == plain(entity["word"].removeprefix("##")), (text, entity)
        assert "🙂" not in text or any(text[e["start"] : e["end"]] == "🙂" for e in entities)


async def test_ignore_labels_and_long_texts_with_stride(tiny_token_classifier):
    reference = pipeline(tiny_token_classifier)
    async with serving(tiny_token_classifier) as client:
        kept = (await client.post("/token-classification", json={
            "inputs": TEXTS[0], "aggregation_strategy": "simple", "ignore_labels": ["O", "LOC"]})).json()["results"][0]
        strided = {s: (await client.post("/token-classification", json={
            "inputs": LONG, "aggregation_strategy": s, "stride": 16})).json()["results"][0]
            for s in ("simple", "first", "average", "max")}
        refused = await client.post("/token-classification", json={"inputs": LONG})
        none_with_stride = await client.post("/token-classification", json={"inputs": LONG, "stride": 16})
        too_wide = await client.post("/token-classification", json={"inputs": LONG, "stride": 126,
                                                                    "aggregation_strategy": "first"})
    assert_same(kept, reference(TEXTS[0], aggregation_strategy="simple", ignore_labels=["O", "LOC"]), TEXTS[0])
    for strategy, ours in strided.items():
        assert_same(ours, reference(LONG, aggregation_strategy=strategy, stride=16), strategy)
        assert max(e["end"] for e in ours) > len(LONG) // 2  # the later windows count
    assert refused.status_code == 422 and "stride" in refused.json()["error"]
    assert none_with_stride.status_code == 422 and none_with_stride.json()["error"].startswith("stride")
    assert too_wide.status_code == 422 and "stride must be between 0 and 125" in too_wide.json()["error"]


async def test_bad_input_and_a_checkpoint_without_the_head(tiny_token_classifier, tiny_checkpoint):
    async with serving(tiny_token_classifier) as client:
        empty = await client.post("/token-classification", json={"inputs": "   "})
        nothing = await client.post("/token-classification", json={"inputs": []})
        strategy = await client.post("/token-classification", json={"inputs": "a", "aggregation_strategy": "mean"})
        info = (await client.get("/info")).json()
    assert empty.status_code == 422 and "inputs[0]" in empty.json()["error"]
    assert nothing.status_code == 422
    assert strategy.status_code == 422 and "aggregation_strategy" in strategy.json()["error"]
    assert info["heads"]["token_classifier"] is True and info["heads"]["classifier"] is False
    assert info["config"]["id2label"]["1"] == "B-PER"
    async with serving(tiny_checkpoint) as client:
        missing = await client.post("/token-classification", json={"inputs": "a"})
        predict = await client.post("/predict", json={"inputs": "a"})
    assert missing.status_code == predict.status_code == 424
    assert "token-classification head" in missing.json()["error"] and "masked-LM head" in missing.json()["error"]


async def test_the_answer_is_bounded_before_any_compute(tiny_token_classifier, tiny_question_answerer):
    async with serving(tiny_token_classifier, max_response_mb=0.002) as client:
        small = await client.post("/token-classification", json={"inputs": "ada lived here ."})
        large = await client.post("/token-classification", json={"inputs": TEXTS * 4})
    assert small.status_code == 200
    assert large.status_code == 422 and "max_response_mb" in large.json()["error"]
    context = " ".join(TEXTS)
    async with serving(tiny_question_answerer, max_response_mb=0.002) as client:
        one = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": context}})
        many = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": context},
                                                               "top_k": 40})
    assert one.status_code == 200
    assert many.status_code == 422 and "40 answers" in many.json()["error"]
