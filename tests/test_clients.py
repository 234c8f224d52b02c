"""The clients people already have, unchanged, against the server as `make serve` runs it (the bundled model)
and against a served cross-encoder: huggingface_hub's InferenceClient (sync and async, 2.x here and 1.x in the
clients' environment), LangChain's OpenAI and Hugging Face embeddings, LlamaIndex's TEI and OpenAI-like
embeddings; the Cohere SDK's rerank and LangChain's Cohere reranker against a cross-encoder and a ColBERT; two
models behind one server, reached by OpenAI's `model` and by base URL. Vectors and scores are compared with
transformers' on the same checkpoint (1e-4, float32), rerank scores with /rerank's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import AsyncInferenceClient, InferenceClient

from devkit.paths import REPO_ROOT
from devkit.server import start_service
from model import load_checkpoint
from model.config import served_embedding_layer
from service.settings import DEFAULT_CHECKPOINT
from tests.clients.drive import TEXTS

KEY = "clients-key-1234"
FLOAT32 = ("--dtype", "float32")  # held to transformers' float32 (--dtype auto may serve bfloat16 on this CPU)
CLIENTS_PYTHON = Path(os.environ.get("BERT_CLIENTS_PYTHON", REPO_ROOT / ".venv-clients" / "bin" / "python"))


@pytest.fixture(scope="module")
def bundled():
    process, url = start_service(DEFAULT_CHECKPOINT, "--api-key", KEY, *FLOAT32)
    yield url
    process.terminate()
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def stacked(tmp_path_factory, tokenizer):
    """A checkpoint with a layer stacked for its heads (trainer --head-layers): embeddings from layer 2 of 3."""
    from model import save_checkpoint
    from tests.conftest import random_model

    directory = tmp_path_factory.mktemp("stacked") / "stacked"
    save_checkpoint(directory, random_model(tokenizer.vocab_size, seed=11, num_hidden_layers=3, embedding_layer=2),
                    tokenizer)
    process, url = start_service(directory, "--api-key", KEY, *FLOAT32)
    yield directory, url
    process.terminate()
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def cross_encoder(tiny_cross_encoder):
    process, url = start_service(tiny_cross_encoder, "--api-key", KEY, *FLOAT32)
    yield url
    process.terminate()
    process.wait(timeout=60)


def mean_pooled_reference(directory, texts: list[str]) -> np.ndarray:
    """transformers' BertModel, mean over each text's tokens, normalised: what every embedding client should get.
    The layer is the checkpoint's `embedding_layer` where it names one (a model with layers stacked for its heads)."""
    model = transformers.BertModel.from_pretrained(directory, add_pooling_layer=False, dtype=torch.float32).eval()
    layer = served_embedding_layer(model.config)
    tokenizer = load_checkpoint(directory).tokenizer
    rows = []
    for text in texts:
        with torch.no_grad():
            states = model(input_ids=torch.tensor([tokenizer.encode(text).ids]), output_hidden_states=True)
            hidden = states.hidden_states[layer][0]
        vector = hidden.mean(0).numpy()
        rows.append(vector / np.linalg.norm(vector))
    return np.stack(rows)


def drive(url: str, *checks: str) -> dict:
    if not CLIENTS_PYTHON.is_file():
        if os.environ.get("BERT_REQUIRE_CLIENTS"):
            pytest.fail(f"{CLIENTS_PYTHON} is missing: `make test` installs requirements/clients.txt there")
        pytest.skip(f"{CLIENTS_PYTHON} is missing (make test installs the client libraries there)")
    result = subprocess.run([str(CLIENTS_PYTHON), str(REPO_ROOT / "tests" / "clients" / "drive.py"), url, KEY, *checks],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout)
    for name, answer in answers.items():
        assert "raised" not in answer, f"{name}: {answer['raised']}"
    return answers


def test_inference_client_every_task_sync_and_async(bundled):
    want = mean_pooled_reference(DEFAULT_CHECKPOINT, TEXTS)
    client = InferenceClient(base_url=bundled, token=KEY)
    features = client.feature_extraction(TEXTS)
    np.testing.assert_allclose(features, want, atol=1e-4)
    np.testing.assert_allclose(client.feature_extraction(TEXTS[0], normalize=True, truncate=True)[0], want[0], atol=1e-4)
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    np.testing.assert_allclose(similarity, want[1:] @ want[0], atol=1e-4)
    filled = client.fill_mask("the river [MASK] to the sea .", top_k=3)
    assert len(filled) == 3 and filled[0].score >= filled[1].score >= filled[2].score
    assert filled[0].sequence == f"the river {filled[0].token_str} to the sea."
    targeted = client.fill_mask("the river [MASK] to the sea .", targets=["flows", "runs"])
    assert {t.token_str for t in targeted} == {"flows", "runs"}

    async def asynchronous():
        async_client = AsyncInferenceClient(base_url=bundled, token=KEY)
        return (await async_client.feature_extraction(TEXTS), await async_client.fill_mask("a [MASK] is flying ."),
                await async_client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:]))

    async_features, async_filled, async_similarity = asyncio.run(asynchronous())
    np.testing.assert_allclose(async_features, want, atol=1e-4)
    assert len(async_filled) == 5
    np.testing.assert_allclose(async_similarity, similarity, atol=1e-6)


def test_inference_client_errors_are_its_own(bundled):
    from huggingface_hub.errors import HfHubHTTPError

    client = InferenceClient(base_url=bundled, token=KEY)
    with pytest.raises(HfHubHTTPError) as raised:
        client.fill_mask("no mask here", top_k=0)
    assert raised.value.response.status_code == 422 and "top_k" in str(raised.value)
    with pytest.raises(HfHubHTTPError) as raised:
        InferenceClient(base_url=bundled, token="wrong-key-0000").feature_extraction("a")
    assert raised.value.response.status_code == 401


def test_embedding_clients_of_langchain_and_llama_index(bundled):
    want = mean_pooled_reference(DEFAULT_CHECKPOINT, TEXTS)
    answers = drive(bundled, "langchain_openai_embeddings", "langchain_huggingface_embeddings", "llama_index_tei",
                    "llama_index_openai_like", "inference_client_hub1", "langchain_openai_defaults")
    for name in ("langchain_openai_embeddings", "langchain_huggingface_embeddings", "llama_index_tei",
                 "llama_index_openai_like"):
        answer = answers[name]
        np.testing.assert_allclose(answer["documents"], want, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(answer["query"], want[0], atol=1e-4, err_msg=name)
        if "async" in answer:
            np.testing.assert_allclose(answer["async"], want[:2], atol=1e-4, err_msg=name)
    hub1 = answers["inference_client_hub1"]
    assert hub1["version"].startswith("1.")
    np.testing.assert_allclose(np.array(hub1["features"]).reshape(-1), want[0], atol=1e-4)
    np.testing.assert_allclose(hub1["similarity"], want[1:] @ want[0], atol=1e-4)
    defaults = answers["langchain_openai_defaults"]  # token-id arrays: refused, naming the way out
    assert defaults["status"] == 400 and "check_embedding_ctx_length=False" in defaults["message"]


def test_clients_against_a_served_cross_encoder(cross_encoder, tiny_cross_encoder):
    model = transformers.BertForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()
    tokenizer = load_checkpoint(tiny_cross_encoder).tokenizer
    encoded = tokenizer.encode(TEXTS[0])
    with torch.no_grad():
        logit = model(input_ids=torch.tensor([encoded.ids])).logits[0, 0].item()
    client = InferenceClient(base_url=cross_encoder, token=KEY)
    classified = client.text_classification(TEXTS[0])
    assert classified[0].label == "LABEL_0" and abs(classified[0].score - 1 / (1 + np.exp(-logit))) < 1e-4
    raw = client.text_classification(TEXTS[0], function_to_apply="none")
    assert abs(raw[0].score - logit) < 1e-4
    async_classified = asyncio.run(AsyncInferenceClient(base_url=cross_encoder, token=KEY).text_classification(TEXTS[0]))
    assert abs(async_classified[0].score - classified[0].score) < 1e-6
    # the cross-encoder's encoder still embeds, when the request asks for feature extraction
    vectors = client.feature_extraction(TEXTS[:2], normalize=True)
    np.testing.assert_allclose(vectors, mean_pooled_reference(tiny_cross_encoder, TEXTS[:2]), atol=1e-4)
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    assert len(similarity) == 2
    # the embedding clients of LangChain and LlamaIndex keep working (the root classifies bare inputs, as TEI's
    # does, so LangChain's Hugging Face class says `normalize` to ask for vectors)
    want = mean_pooled_reference(tiny_cross_encoder, TEXTS)
    answers = drive(cross_encoder, "langchain_openai_embeddings", "langchain_huggingface_embeddings_normalized",
                    "llama_index_tei", "llama_index_openai_like")
    for name, answer in answers.items():
        np.testing.assert_allclose(answer["documents"], want, atol=1e-4, err_msg=name)


def test_clients_against_a_checkpoint_with_layers_stacked_for_its_heads(stacked):
    """Every embedding client gets the embedding layer's vectors (not the top layer's, which the test tells apart);
    fill-mask answers from the top, as transformers' BertForMaskedLM on the same directory."""
    directory, url = stacked
    want = mean_pooled_reference(directory, TEXTS)
    top = transformers.BertModel.from_pretrained(directory, add_pooling_layer=False).eval()
    with torch.no_grad():
        last = top(input_ids=torch.tensor([load_checkpoint(directory).tokenizer.encode(TEXTS[0]).ids])).last_hidden_state
    assert np.abs(last[0].mean(0).numpy() / np.linalg.norm(last[0].mean(0).numpy()) - want[0]).max() > 1e-3
    client = InferenceClient(base_url=url, token=KEY)
    np.testing.assert_allclose(client.feature_extraction(TEXTS), want, atol=1e-4)
    np.testing.assert_allclose(client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:]), want[1:] @ want[0],
                               atol=1e-4)
    pipe = transformers.pipeline("fill-mask", model=transformers.BertForMaskedLM.from_pretrained(directory).eval(),
                                 tokenizer=transformers.BertTokenizerFast.from_pretrained(directory), device="cpu")
    filled = client.fill_mask("the river [MASK] to the sea .", top_k=3)
    expected = pipe("the river [MASK] to the sea .", top_k=3)
    assert [f.token for f in filled] == [e["token"] for e in expected]
    np.testing.assert_allclose([f.score for f in filled], [e["score"] for e in expected], atol=1e-5)
    import openai

    vectors = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0).embeddings.create(input=TEXTS, model="bert")
    np.testing.assert_allclose([row.embedding for row in vectors.data], want, atol=1e-4)
    answers = drive(url, "langchain_openai_embeddings", "langchain_huggingface_embeddings", "llama_index_tei",
                    "llama_index_openai_like", "inference_client_hub1")
    for name in ("langchain_openai_embeddings", "langchain_huggingface_embeddings", "llama_index_tei",
                 "llama_index_openai_like"):
        np.testing.assert_allclose(answers[name]["documents"], want, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(np.array(answers["inference_client_hub1"]["features"]).reshape(-1), want[0], atol=1e-4)


@pytest.fixture(scope="module")
def task_heads(tiny_token_classifier, tiny_question_answerer):
    """Two live servers: a token classifier and a question answerer (BertFor... checkpoints written by transformers),
    each with two front-end processes, so the new items and results cross the engine's wire (service.messages)."""
    servers = [start_service(checkpoint, "--api-key", KEY, "--workers", "2", *FLOAT32)
               for checkpoint in (tiny_token_classifier, tiny_question_answerer)]
    yield [url for _, url in servers]
    for process, _ in servers:
        process.terminate()
        process.wait(timeout=60)


def test_inference_client_token_classification_and_question_answering(task_heads, tiny_token_classifier):
    ner_url, qa_url = task_heads
    text = "Ada Lovelace lived in London with Charles Babbage ."
    reference = transformers.pipeline("token-classification", model=str(tiny_token_classifier), device="cpu")
    entities = InferenceClient(base_url=ner_url, token=KEY).token_classification(text, aggregation_strategy="first")
    want = reference(text, aggregation_strategy="first")
    assert [(e.entity_group, e.word, e.start, e.end) for e in entities] == \
        [(e["entity_group"], e["word"], e["start"], e["end"]) for e in want]
    np.testing.assert_allclose([e.score for e in entities], [float(e["score"]) for e in want], atol=1e-4)
    grouped = InferenceClient(base_url=ner_url, token=KEY).token_classification(text)  # the Inference API's default
    assert grouped and all(e.entity_group and text[e.start : e.end] for e in grouped)

    client = InferenceClient(base_url=qa_url, token=KEY)
    best = client.question_answering(question="where did ada live ?", context=text)
    assert text[best.start : best.end] == best.answer and 0 < best.score <= 1
    several = client.question_answering(question="where did ada live ?", context=text, top_k=3)
    # A larger top_k weighs more spans per window, and spans of the same text add up, so the winner may change
    # (as in transformers' pipeline); what cannot happen is a best score below top_k=1's.
    assert len(several) == 3 and several[0].score >= best.score - 1e-4
    assert several[0].score >= several[1].score >= several[2].score
    assert all(text[a.start : a.end] == a.answer for a in several)

    async def asynchronous():
        return await AsyncInferenceClient(base_url=qa_url, token=KEY).question_answering(
            question="where did ada live ?", context=text)

    assert asyncio.run(asynchronous()).answer == best.answer

    # huggingface_hub 1.x, in the clients' own environment, reads the same answers
    hub1 = drive(ner_url, "inference_client_hub1_token_classification")["inference_client_hub1_token_classification"]
    want = reference(TEXTS[2], aggregation_strategy="first")
    assert [(e["entity_group"], e["start"], e["end"]) for e in hub1["entities"]] == \
        [(e["entity_group"], e["start"], e["end"]) for e in want]
    answers = drive(qa_url, "inference_client_hub1_question_answering")["inference_client_hub1_question_answering"]
    assert answers["best"]["answer"] == TEXTS[2][answers["best"]["start"] : answers["best"]["end"]]
    # The same span; its score to batching's rounding (the two requests may share a batch with different company).
    first, best = answers["top"][0], answers["best"]
    assert len(answers["top"]) == 2 and (first["answer"], first["start"], first["end"]) == \
        (best["answer"], best["start"], best["end"])
    assert abs(first["score"] - best["score"]) < 1e-3


@pytest.fixture(scope="module")
def two_models(tiny_checkpoint, tiny_cross_encoder):
    """One server, two models: an embedder (the default) and a cross-encoder."""
    process, url = start_service(f"embed={tiny_checkpoint}", "--checkpoint", f"rerank={tiny_cross_encoder}",
                                 "--api-key", KEY, *FLOAT32)
    yield url, {"embed": tiny_checkpoint, "rerank": tiny_cross_encoder}
    process.terminate()
    process.wait(timeout=60)


def test_the_openai_client_picks_each_of_two_models_by_name(two_models):
    import openai

    url, directories = two_models
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["embed", "rerank"]
    for name, directory in directories.items():
        response = client.embeddings.create(model=name, input=TEXTS)
        assert response.model == name
        got = np.array([d.embedding for d in response.data])
        np.testing.assert_allclose(got, mean_pooled_reference(directory, TEXTS), atol=1e-4, err_msg=name)
    with pytest.raises(openai.NotFoundError) as raised:
        client.embeddings.create(model="text-embedding-3-small", input=TEXTS[0])
    assert "embed, rerank" in str(raised.value)


def test_hugging_face_and_tei_clients_reach_a_model_by_its_base_url(two_models):
    url, directories = two_models
    for name, directory in directories.items():
        want = mean_pooled_reference(directory, TEXTS)
        client = InferenceClient(base_url=f"{url}/models/{name}", token=KEY)
        np.testing.assert_allclose(client.feature_extraction(TEXTS, normalize=True), want, atol=1e-4, err_msg=name)
        answers = drive(f"{url}/models/{name}", "llama_index_tei", "llama_index_openai_like")
        for check, answer in answers.items():
            np.testing.assert_allclose(answer["documents"], want, atol=1e-4, err_msg=f"{name} {check}")
    scores = InferenceClient(base_url=f"{url}/models/rerank", token=KEY).text_classification(
        {"text": TEXTS[0], "text_pair": TEXTS[1]})
    assert len(scores) == 1 and 0 <= scores[0].score <= 1


@pytest.fixture(scope="module")
def colbert(tiny_colbert):
    """A served ColBERT with two front-end processes, so its items and the Cohere answers cross the engine's wire."""
    process, url = start_service(tiny_colbert, "--api-key", KEY, "--workers", "2", *FLOAT32)
    yield url
    process.terminate()
    process.wait(timeout=60)


@pytest.mark.anyio
async def test_long_inputs_and_colbert_vectors_cross_the_engine_process_as_they_compute_in_one(colbert, tiny_colbert):
    """Windows folded in the engine process, a ColBERT's items and vectors over the wire: as with one process."""
    import httpx

    from tests.service.conftest import serving

    text = " ".join(TEXTS * 8)  # longer than the model (128) and than a document (24): a few windows of each
    bodies = [("/embed", {"inputs": [text, TEXTS[0]], "long_input": "chunk"}),
              ("/token-vectors", {"inputs": [text, TEXTS[1]], "long_input": "chunk"}),
              ("/token-vectors", {"inputs": TEXTS, "mode": "query"})]
    with httpx.Client(base_url=colbert, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        remote = [client.post(route, json=body).json() for route, body in bodies]
    async with serving(tiny_colbert) as client:
        local = [(await client.post(route, json=body)).json() for route, body in bodies]
    np.testing.assert_allclose(remote[0], local[0], atol=1e-5)
    assert len(remote[0]) == 2
    assert len(remote[1]["results"][0]["tokens"]) > 2 * 24  # several windows' vectors
    for mine, theirs in zip(remote[1:], local[1:]):
        for a, b in zip(mine["results"], theirs["results"]):
            assert a["tokens"] == b["tokens"]
            np.testing.assert_allclose(a["vectors"], b["vectors"], atol=1e-5)


@pytest.mark.parametrize("server", ["cross_encoder", "colbert"])
def test_cohere_sdk_and_langchain_cohere_rerank_read_the_scores_of_rerank(server, request):
    import httpx

    url = request.getfixturevalue(server)
    from tests.clients.drive import QUERY

    want = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
    answers = drive(url, "cohere_rerank", "langchain_cohere_rerank")
    rerank = answers["cohere_rerank"]
    assert rerank["version"].startswith("5.")
    assert [(r["index"], r["text"]) for r in rerank["v1"]] == [(w["index"], TEXTS[w["index"]]) for w in want[:2]]
    np.testing.assert_allclose([r["score"] for r in rerank["v1"]], [w["score"] for w in want[:2]], atol=1e-4)
    assert [r["index"] for r in rerank["v2"]] == [w["index"] for w in want]
    np.testing.assert_allclose([r["score"] for r in rerank["v2"]], [w["score"] for w in want], atol=1e-4)
    assert rerank["refused"]["status"] == 400 and "top_n" in rerank["refused"]["body"]["message"]
    kept = answers["langchain_cohere_rerank"]["documents"]
    assert [d["text"] for d in kept] == [TEXTS[w["index"]] for w in want[:2]]
    np.testing.assert_allclose([d["score"] for d in kept], [w["score"] for w in want[:2]], atol=1e-4)
