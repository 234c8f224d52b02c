"""A served ColBERT (PyLate's and colbert-ai's layouts): /info names it; /token-vectors gives each input's vectors as
transformers' BertModel with the ColBERT's attention mask, projection and normalisation does (markers, [MASK]
expansion, skiplist; the libraries themselves are compared in tests/test_colbert_reference.py), batched as alone,
float16 and base64 where asked; long documents refused, truncated or chunked; the rerank routes score by MaxSim of
those vectors; bad input gets a 4xx naming the problem."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from model import load_checkpoint
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
QUERIES = ["where did the storm make landfall ?", "who built the old mill",
           "a query longer than the query length is cut as the encoders cut it, then it fills no [MASK] at all"]
DOCUMENTS = ["The storm moved north and made landfall near the coast, on Monday.",
             "A mill was built by the river ( in 1800 ) ; it ground wheat !",
             "Bananas are yellow."]
LONG = " ".join(f"In {1800 + n} the mill by the river ground {n} sacks of wheat for the village ." for n in range(8))


class Reference:
    """transformers' BertModel on the checkpoint with the ColBERT's rule restated here: ids, attention mask, kept
    positions, then the projection (its layers as the checkpoint stores them) and L2 normalisation."""

    def __init__(self, directory):
        self.encoder = transformers.BertModel.from_pretrained(directory, add_pooling_layer=False).eval()
        loaded = load_checkpoint(directory)
        self.projection, self.recipe, self.tokenizer = loaded.model.projection, loaded.late_interaction, loaded.tokenizer
        self.skiplist = {self.tokenizer.token_to_id(w) or self.tokenizer.unk_id for w in self.recipe.skiplist_words}

    def marked(self, pieces: list[int], marker: str) -> list[int]:
        return [self.tokenizer.cls_id, self.tokenizer.token_to_id(marker), *pieces, self.tokenizer.sep_id]

    def query(self, text: str) -> np.ndarray:
        length = self.recipe.query_length
        ids = self.marked(self.tokenizer.encode(text).ids[1:-1][: length - 3], self.recipe.query_prefix)
        keys = length if self.recipe.attend_to_expansion_tokens else len(ids)
        return self.vectors(ids + [self.tokenizer.mask_id] * (length - len(ids)), keys)

    def document(self, pieces: list[int]) -> np.ndarray:
        ids = self.marked(pieces, self.recipe.document_prefix)
        return self.vectors(ids, len(ids))[[i for i, t in enumerate(ids) if t not in self.skiplist]]

    def pieces(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids[1:-1]

    def vectors(self, ids: list[int], keys: int) -> np.ndarray:
        mask = torch.zeros(1, len(ids), dtype=torch.long)
        mask[0, :keys] = 1
        with torch.no_grad():
            hidden = self.encoder(input_ids=torch.tensor([ids]), attention_mask=mask).last_hidden_state[0]
            return F.normalize(self.projection(hidden), dim=-1).numpy()


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    return float(sum(max(float(q @ d) for d in document) for q in query))


def assert_vectors(got: list, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("layout", ["tiny_colbert", "tiny_colbert_ai"])
async def test_vectors_equal_the_encoder_with_the_colbert_rule_batched_and_alone(layout, request):
    directory = request.getfixturevalue(layout)
    reference = Reference(directory)
    async with serving(directory) as client:
        info = (await client.get("/info")).json()
        queries = (await client.post("/token-vectors", json={"inputs": QUERIES, "mode": "query"})).json()
        documents = (await client.post("/token-vectors", json={"inputs": DOCUMENTS})).json()
        # one at a time, and all of them at once in concurrent requests of both modes
        alone = [(await client.post("/token-vectors", json={"inputs": text, "mode": mode})).json()["results"][0]
                 for mode, texts in (("query", QUERIES), ("document", DOCUMENTS)) for text in texts]
        together = await asyncio.gather(*[client.post("/token-vectors", json={"inputs": text, "mode": mode})
                                          for mode, texts in (("query", QUERIES), ("document", DOCUMENTS))
                                          for text in texts])
    recipe = reference.recipe
    assert info["heads"]["late_interaction"] and info["late_interaction"]["dim"] == recipe.dim
    assert info["late_interaction"]["query_length"] == recipe.query_length
    assert info["late_interaction"]["document_length"] == recipe.document_length
    assert queries["dim"] == recipe.dim and queries["mode"] == "query"
    for result, text in zip(queries["results"], QUERIES):
        assert len(result["tokens"]) == recipe.query_length and result["tokens"][1] == recipe.query_prefix
        assert_vectors(result["vectors"], reference.query(text))
    assert [r["tokens"][-1] for r in queries["results"]] == ["[MASK]", "[MASK]", "[SEP]"]
    for result, text in zip(documents["results"], DOCUMENTS):
        assert not set(result["tokens"]) & {".", ",", "(", ")", ";", "!"}  # the skiplist gives no vectors
        assert_vectors(result["vectors"], reference.document(reference.pieces(text)))
    every = queries["results"] + documents["results"]
    for one, mine, concurrent in zip(every, alone, together):
        np.testing.assert_allclose(mine["vectors"], one["vectors"], atol=1e-5)
        np.testing.assert_allclose(concurrent.json()["results"][0]["vectors"], one["vectors"], atol=1e-5)


async def test_long_documents_refused_truncated_or_read_in_windows(tiny_colbert):
    reference = Reference(tiny_colbert)
    pieces = reference.pieces(LONG)
    room = reference.recipe.document_length - 3
    assert len(pieces) > 4 * room
    async with serving(tiny_colbert, long_input_overlap=5) as client:
        refused = await client.post("/token-vectors", json={"inputs": ["short", LONG]})
        cut = (await client.post("/token-vectors", json={"inputs": LONG, "truncate": True})).json()
        chunked = (await client.post("/token-vectors", json={"inputs": [LONG, "short"], "long_input": "chunk"})).json()
        both = await client.post("/token-vectors", json={"inputs": LONG, "truncate": True, "long_input": "chunk"})
    assert refused.status_code == 422 and "inputs[1]" in refused.json()["error"]
    assert "at most 24" in refused.json()["error"] and "long_input: chunk" in refused.json()["error"]
    assert_vectors(cut["results"][0]["vectors"], reference.document(pieces[:room]))
    starts = range(0, len(pieces), room - 5)  # windows of `room` pieces, 5 shared by neighbours, the last reaching the end
    windows = [pieces[s : s + room] for s in starts if s == 0 or s + 5 < len(pieces)]
    assert windows[-1][-1] == pieces[-1] and len(windows) > 4
    assert_vectors(chunked["results"][0]["vectors"], np.concatenate([reference.document(w) for w in windows]))
    assert_vectors(chunked["results"][1]["vectors"], reference.document(reference.pieces("short")))
    assert both.status_code == 422 and "not both" in both.json()["error"]


async def test_float16_and_base64_are_the_same_vectors(tiny_colbert):
    async with serving(tiny_colbert) as client:
        full = (await client.post("/token-vectors", json={"inputs": DOCUMENTS[0]})).json()["results"][0]
        half = (await client.post("/token-vectors", json={"inputs": DOCUMENTS[0], "dtype": "float16"})).json()
        packed = (await client.post("/token-vectors", json={"inputs": DOCUMENTS[0], "dtype": "float16",
                                                            "encoding_format": "base64"})).json()
        packed32 = (await client.post("/token-vectors", json={"inputs": DOCUMENTS[0],
                                                              "encoding_format": "base64"})).json()
    want = np.asarray(full["vectors"], dtype=np.float32)
    assert half["dtype"] == "float16"
    # JSON numbers written as float32 (float16 values are float32 values): read back as float32, exactly float16's
    np.testing.assert_array_equal(np.asarray(half["results"][0]["vectors"], dtype=np.float32),
                                  want.astype(np.float16).astype(np.float32))
    rows16 = [np.frombuffer(base64.b64decode(row), dtype="<f2") for row in packed["results"][0]["vectors"]]
    rows32 = [np.frombuffer(base64.b64decode(row), dtype="<f4") for row in packed32["results"][0]["vectors"]]
    np.testing.assert_array_equal(np.stack(rows16), want.astype(np.float16))
    np.testing.assert_array_equal(np.stack(rows32), want)


async def test_every_rerank_route_scores_by_maxsim_of_the_vectors(tiny_colbert):
    async with serving(tiny_colbert) as client:
        query = (await client.post("/token-vectors", json={"inputs": QUERIES[0], "mode": "query"})).json()
        documents = (await client.post("/token-vectors", json={"inputs": DOCUMENTS})).json()
        tei = (await client.post("/rerank", json={"query": QUERIES[0], "texts": DOCUMENTS, "return_text": True})).json()
        v1 = (await client.post("/v1/rerank", json={"model": "colbert", "query": QUERIES[0], "documents": DOCUMENTS,
                                                     "top_n": 2, "return_documents": True})).json()
        v2 = (await client.post("/v2/rerank", json={"model": "colbert", "query": QUERIES[0],
                                                    "documents": [{"text": d} for d in DOCUMENTS]})).json()
    want = [maxsim(np.asarray(query["results"][0]["vectors"]), np.asarray(d["vectors"])) for d in documents["results"]]
    order = list(np.argsort(want)[::-1])
    assert [r["index"] for r in tei] == order and [r["text"] for r in tei] == [DOCUMENTS[i] for i in order]
    np.testing.assert_allclose([r["score"] for r in tei], [want[i] for i in order], atol=1e-4)
    assert [r["index"] for r in v1["results"]] == order[:2]
    assert [r["document"]["text"] for r in v1["results"]] == [DOCUMENTS[i] for i in order[:2]]
    np.testing.assert_allclose([r["relevance_score"] for r in v1["results"]], [want[i] for i in order[:2]], atol=1e-4)
    assert v1["meta"]["api_version"]["version"] == "1" and v1["id"]
    assert [r["index"] for r in v2["results"]] == order and "document" not in v2["results"][0]
    assert v2["meta"]["api_version"]["version"] == "2"


@pytest.mark.parametrize("route, body, status, words", [
    ("/v1/rerank", {"query": "a storm", "documents": []}, 400, "documents is empty"),
    ("/v1/rerank", {"query": "a storm", "documents": DOCUMENTS, "top_n": 0}, 400, "top_n must be between 1 and the number of documents (3)"),
    ("/v2/rerank", {"query": "a storm", "documents": DOCUMENTS, "top_n": 4}, 400, "top_n must be between 1 and the number of documents (3)"),
    ("/v1/rerank", {"query": "?! ...", "documents": DOCUMENTS}, 400, "only skiplist tokens"),
    ("/v1/rerank", {"query": "  ", "documents": DOCUMENTS}, 400, "query is empty"),
    ("/v1/rerank", {"query": "a storm", "documents": ["fine", LONG]}, 400, "documents[1] is"),
    ("/v2/rerank", {"query": "a storm", "documents": [LONG], "max_tokens_per_doc": 8}, 400, "max_tokens_per_doc"),
    ("/v1/rerank", {"query": "a storm", "documents": DOCUMENTS, "max_chunks_per_doc": 2}, 400, "max_chunks_per_doc"),
    ("/v1/rerank", {"query": "a storm", "documents": DOCUMENTS, "rank_fields": ["title"]}, 400, "rank_fields"),
    ("/v1/rerank", {"query": "a storm"}, 400, "documents"),
    ("/rerank", {"query": "a storm", "texts": ["fine", LONG]}, 422, "texts[1] is"),
    ("/rerank", {"query": "a storm", "texts": []}, 400, "texts is empty"),
    ("/token-vectors", {"inputs": "!!", "mode": "query"}, 422, "only skiplist tokens"),
    ("/token-vectors", {"inputs": [], "mode": "query"}, 422, "inputs is empty"),
    ("/token-vectors", {"inputs": "a", "mode": "passage"}, 422, "mode"),
])
async def test_bad_input_gets_a_4xx_in_the_family_shape_naming_it(tiny_colbert, route, body, status, words):
    async with serving(tiny_colbert) as client:
        response = await client.post(route, json=body)
        still = await client.post("/v1/rerank", json={"query": "a storm", "documents": DOCUMENTS})
    assert response.status_code == status, response.text
    message = response.json()["message"] if route.startswith("/v") else response.json()["error"]
    assert words in message
    assert still.status_code == 200  # everyone else is still served


async def test_long_documents_on_the_rerank_routes_truncated_or_chunked(tiny_colbert):
    reference = Reference(tiny_colbert)
    async with serving(tiny_colbert) as client:
        cut = (await client.post("/v2/rerank", json={"query": QUERIES[1], "documents": [LONG], "truncate": True}))
        capped = (await client.post("/v2/rerank", json={"query": QUERIES[1], "documents": [LONG],
                                                        "max_tokens_per_doc": 4096}))
        chunked = (await client.post("/rerank", json={"query": QUERIES[1], "texts": [LONG, DOCUMENTS[1]],
                                                      "long_input": "chunk"}))
        windows = (await client.post("/token-vectors", json={"inputs": LONG, "long_input": "chunk"})).json()
    query = reference.query(QUERIES[1])
    room = reference.recipe.document_length - 3
    assert cut.json()["results"][0]["relevance_score"] == pytest.approx(
        maxsim(query, reference.document(reference.pieces(LONG)[:room])), abs=1e-4)
    assert capped.json() ["results"][0]["relevance_score"] == cut.json()["results"][0]["relevance_score"]
    scores = {r["index"]: r["score"] for r in chunked.json()}
    assert scores[0] == pytest.approx(maxsim(query, np.asarray(windows["results"][0]["vectors"])), abs=1e-4)


async def test_colbert_routes_on_models_that_are_not_one(tiny_checkpoint, tiny_cross_encoder):
    async with serving(tiny_checkpoint) as client:
        vectors = await client.post("/token-vectors", json={"inputs": "a"})
        v1 = await client.post("/v1/rerank", json={"query": "a", "documents": ["b"]})
    assert vectors.status_code == 424 and "needs a ColBERT" in vectors.json()["error"]
    assert v1.status_code == 400 and "cross-encoder" in v1.json()["message"]
    async with serving(tiny_cross_encoder) as client:
        vectors = await client.post("/token-vectors", json={"inputs": "a"})
        chunk = await client.post("/v1/rerank", json={"query": "a", "documents": ["b"], "long_input": "chunk"})
    assert vectors.status_code == 424 and "classification head" in vectors.json()["error"]
    assert chunk.status_code == 400 and "for a ColBERT" in chunk.json()["message"]


async def test_cohere_routes_on_a_cross_encoder_equal_rerank(tiny_cross_encoder):
    texts = DOCUMENTS + ["the mill ground wheat"]
    async with serving(tiny_cross_encoder) as client:
        tei = (await client.post("/rerank", json={"query": QUERIES[1], "texts": texts})).json()
        v1 = (await client.post("/v1/rerank", json={"model": "m", "query": QUERIES[1], "documents": texts})).json()
        v2 = (await client.post("/v2/rerank", json={"model": "m", "query": QUERIES[1], "documents": texts,
                                                    "top_n": 3, "max_tokens_per_doc": None})).json()
    assert [r["index"] for r in v1["results"]] == [r["index"] for r in tei]
    assert [r["relevance_score"] for r in v1["results"]] == [r["score"] for r in tei]
    assert [r["relevance_score"] for r in v2["results"]] == [r["score"] for r in tei[:3]]
    assert all(0 < r["relevance_score"] < 1 for r in v1["results"])  # the sigmoid of the logit, as /rerank
