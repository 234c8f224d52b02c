"""Several models behind one server: each model's answers on every route family equal the same model served alone,
bit for bit; routing by /models/{name}/... and by OpenAI's `model`; unknown, empty and clashing names answered in each
family's error shape with the served names; per-model admission and queue limits; /info, /v1/models and /metrics per
model; and a start that fails names the model and leaves no half-ready server."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from service.engine.loader import StartupError
from service.engine.models import check_memory
from service.settings import Settings
from tests.service.conftest import serving
from tests.service.frontend.test_errors import GatedEngine

pytestmark = pytest.mark.anyio
TEXTS = ["a crane is flying over the river", "short", "the storm moved north ."]
# (model, path, body) for every route family each model serves
FAMILIES = [
    ("tiny", "/encode", {"inputs": TEXTS, "pooling": "mean", "normalize": True}),
    ("tiny", "/encode", {"inputs": TEXTS[1]}),
    ("tiny", "/fill-mask", {"inputs": ["the [MASK] flows", "a [MASK] b [MASK]"], "top_k": 3}),
    ("tiny", "/nsp", {"inputs": [["a b", "c d"], ["the river", "flows"]]}),
    ("tiny", "/embed", {"inputs": TEXTS}),
    ("tiny", "/embed_all", {"inputs": TEXTS[1]}),
    ("tiny", "/tokenize", {"inputs": TEXTS}),
    ("tiny", "/v1/embeddings", {"input": TEXTS}),
    ("tiny", "/", {"inputs": "the [MASK] flows"}),
    ("rerank", "/rerank", {"query": "where does the river flow", "texts": TEXTS}),
    ("rerank", "/predict", {"inputs": [["a question", "an answer"], ["another", "text"]]}),
    ("rerank", "/v1/embeddings", {"input": TEXTS[0]}),
    ("rerank", "/", {"inputs": {"text": "a question", "text_pair": "an answer"}}),
    ("ner", "/token-classification", {"inputs": "john lives in paris"}),
    ("ner", "/embed", {"inputs": TEXTS[:2]}),
]


@pytest.fixture(scope="module")
def three(tiny_checkpoint, tiny_cross_encoder, tiny_token_classifier):
    return {"tiny": tiny_checkpoint, "rerank": tiny_cross_encoder, "ner": tiny_token_classifier}


def named(models: dict) -> list[str]:
    return [f"{name}={path}" for name, path in models.items()]


async def answers(client, prefix: str, calls) -> list[tuple[int, str]]:
    found = []
    for _, path, body in calls:
        response = await client.post(prefix + path if path != "/" else prefix or "/", json=body)
        found.append((response.status_code, response.text))
    return found


async def test_each_model_answers_every_family_as_it_does_alone(three):
    alone = {}
    for name, path in three.items():
        calls = [call for call in FAMILIES if call[0] == name]
        async with serving([f"{name}={path}"]) as client:
            alone[name] = await answers(client, "", calls)
    async with serving(named(three)) as client:
        for name in three:
            calls = [call for call in FAMILIES if call[0] == name]
            together = await answers(client, f"/models/{name}", calls)
            assert all(status == 200 for status, _ in together), together
            assert together == alone[name], name  # the same bytes
        default = await answers(client, "", [call for call in FAMILIES if call[0] == "tiny"])
        assert default == alone["tiny"]  # unprefixed routes serve the first model
        # OpenAI's `model` picks one of several
        body = {"input": TEXTS, "model": "rerank"}
        by_body = await client.post("/v1/embeddings", json=body)
        by_path = await client.post("/models/rerank/v1/embeddings", json={"input": TEXTS})
        assert by_body.json()["data"] == by_path.json()["data"] and by_body.json()["model"] == "rerank"
        tiny_vectors = (await client.post("/v1/embeddings", json={"input": TEXTS})).json()["data"]
        assert not np.allclose(tiny_vectors[0]["embedding"], by_body.json()["data"][0]["embedding"])


async def test_three_models_at_once_batch_each_as_alone(three):
    """Requests to the three models in flight together: each model's batches hold its own inputs only (another
    model's weights on them would be far off), and each answer equals the same request made alone, to float rounding
    (what shares a batch changes the last bits of a float32 product)."""
    calls = [call for call in FAMILIES if call[1] in ("/embed", "/rerank", "/token-classification")]
    async with serving(named(three)) as client:
        alone = [await answers(client, f"/models/{m}", [(m, p, b)]) for m, p, b in calls]
        together = await asyncio.gather(*(answers(client, f"/models/{m}", [(m, p, b)]) for m, p, b in calls * 4))
    for (status, got), ((_, want),) in zip((one for (one,) in together), alone * 4):
        assert status == 200
        assert_close_json(json.loads(got), json.loads(want))


def assert_close_json(got, want) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_close_json(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_close_json(a, b)
    elif isinstance(want, float):
        assert abs(got - want) <= 1e-5
    else:
        assert got == want


async def test_unknown_empty_and_clashing_names_answer_in_each_familys_shape(three):
    async with serving(named(three)) as client:
        ours = await client.post("/models/nope/encode", json={"inputs": "a"})
        tei = await client.post("/models/nope/embed", json={"inputs": "a"})
        openai = await client.post("/v1/embeddings", json={"input": "a", "model": "nope"})
        empty = await client.post("/models//embed", json={"inputs": "a"})
        odd = await client.post("/models/a%20b/embed", json={"inputs": "a"})
        clash = await client.post("/models/tiny/v1/embeddings", json={"input": "a", "model": "rerank"})
        no_head = await client.post("/models/rerank/fill-mask", json={"inputs": "the [MASK] flows"})
        info = (await client.get("/info")).json()
        rerank_info = (await client.get("/models/rerank/info")).json()
        models = (await client.get("/v1/models")).json()
        await client.post("/models/rerank/rerank", json={"query": "q", "texts": ["a"]})
        metrics = (await client.get("/metrics")).text
    for response in (ours, tei, empty, odd):
        assert response.status_code == 404
        assert "tiny, rerank, ner" in response.json()["error"]
    assert ours.json()["error_type"] == "not_found" and tei.json()["error_type"] == "Validation"  # TEI's shape
    assert openai.status_code == 404 and openai.json()["error"]["param"] == "model"
    assert "tiny, rerank, ner" in openai.json()["error"]["message"]
    assert clash.status_code == 400 and "not the model of the path" in clash.json()["error"]["message"]
    assert no_head.status_code == 501 and "(model rerank)" in no_head.json()["error"]
    assert info["name"] == "tiny" and info["default_model"] == "tiny"
    assert [m["name"] for m in info["models"]] == ["tiny", "rerank", "ner"]
    assert info["models"][1]["heads"]["classifier"] and not info["models"][0]["heads"]["classifier"]
    assert rerank_info["name"] == "rerank" and rerank_info["model_type"] == {"reranker": rerank_info["model_type"]["reranker"]}
    assert [m["id"] for m in models["data"]] == ["tiny", "rerank", "ner"]
    assert 'bert_requests_total{model="rerank",route="/rerank",status="200"} 1.0' in metrics
    assert 'bert_items_computed_total{model="rerank"}' in metrics


async def test_with_one_model_any_openai_model_name_is_answered(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        response = await client.post("/v1/embeddings", json={"input": "a", "model": "text-embedding-3-small"})
        prefixed = await client.post("/models/tiny/embed", json={"inputs": "a"})
        wrong = await client.post("/models/other/embed", json={"inputs": "a"})
    assert response.status_code == 200 and response.json()["model"] == "tiny"
    assert prefixed.status_code == 200 and wrong.status_code == 404


async def test_a_flooded_model_is_refused_while_another_is_admitted(tiny_checkpoint, tiny_cross_encoder):
    """Queue limits are per model: the flooded model answers 429 with Retry-After, the other is queued (here behind
    a held device) and answered."""
    GatedEngine.gate.clear()
    GatedEngine.entered.clear()
    models = [f"flooded={tiny_checkpoint}", f"other={tiny_cross_encoder}"]
    async with serving(models, engine_factory=GatedEngine, model_setting=["flooded:max_queue_items=2"],
                       concurrent_batches=1, max_batch_size=1, warmup=False) as client:
        try:
            pending = [asyncio.ensure_future(client.post("/models/flooded/embed", json={"inputs": "x"}))]
            assert await asyncio.to_thread(GatedEngine.entered.wait, 10)  # one on the (held) device
            pending += [asyncio.ensure_future(client.post("/models/flooded/embed", json={"inputs": "x"}))
                        for _ in range(8)]
            await asyncio.sleep(0.5)
            other = asyncio.ensure_future(client.post("/models/other/rerank", json={"query": "q", "texts": ["a"]}))
            await asyncio.sleep(0.3)
            refused = [p.result() for p in pending if p.done()]
            assert len(refused) in (5, 6), [r.text for r in refused]  # two queued, one perhaps prepared
            for response in refused:
                assert response.status_code == 429 and "queue is full for model flooded" in response.json()["error"]
                assert int(response.headers["retry-after"]) >= 1
            assert not other.done()  # queued behind the held device, not refused
            accepted = [p for p in pending if not p.done()]
        finally:
            GatedEngine.gate.set()
        assert (await other).status_code == 200
        assert [r.status_code for r in await asyncio.gather(*accepted)] == [200] * len(accepted)


def test_settings_name_models_and_refuse_what_cannot_work(tiny_checkpoint, tiny_cross_encoder):
    specs = Settings(checkpoint=[str(tiny_checkpoint), f"rerank={tiny_cross_encoder}"],
                     model_setting=["rerank:dtype=int8", "rerank:weight=2", "tiny:root_task=fill-mask"]).models()
    assert [(s.name, s.dtype, s.weight, s.root_task) for s in specs] == [
        ("tiny", "auto", 1.0, "fill-mask"), ("rerank", "int8", 2.0, "auto")]
    for bad, words in (
        ({"checkpoint": [f"a={tiny_checkpoint}", f"a={tiny_cross_encoder}"]}, "two models are named 'a'"),
        ({"checkpoint": [str(tiny_checkpoint)], "model_setting": ["other:dtype=int8"]}, "no model is named 'other'"),
        ({"checkpoint": [str(tiny_checkpoint)], "model_setting": ["tiny:port=9"]}, "'port' cannot differ"),
        ({"checkpoint": [str(tiny_checkpoint)], "model_setting": ["tiny:dtype=int4"]}, "dtype must be one of"),
        ({"checkpoint": [str(tiny_checkpoint)], "model_setting": ["tiny:weight=0"]}, "weight must be above 0"),
        ({"checkpoint": [str(tiny_checkpoint)], "model_setting": ["tiny-dtype"]}, "NAME:KEY=VALUE"),
    ):
        with pytest.raises(ValueError, match=words):
            Settings(**bad)


def test_settings_from_the_environment(monkeypatch, tiny_checkpoint, tiny_cross_encoder):
    monkeypatch.setenv("BERT_CHECKPOINT", f"embed={tiny_checkpoint},rerank={tiny_cross_encoder}")
    monkeypatch.setenv("BERT_MODEL_SETTING", json.dumps(["rerank:max_queue_items=8"]))
    specs = Settings().models()
    assert [(s.name, s.max_queue_items) for s in specs] == [("embed", 4096), ("rerank", 8)]


def test_models_that_would_not_fit_are_refused_with_the_figures(monkeypatch, tiny_checkpoint, tiny_cross_encoder):
    import service.engine.models as models

    settings = Settings(checkpoint=[f"a={tiny_checkpoint}", f"b={tiny_cross_encoder}"], device="cpu")
    specs = settings.models()
    directories = {s.name: tiny_checkpoint if s.name == "a" else tiny_cross_encoder for s in specs}
    check_memory(settings, specs, directories)  # they fit this machine
    monkeypatch.setattr(models, "free_memory", lambda device: (1 << 20, "1.0 MiB free (stand-in)"))
    with pytest.raises(StartupError, match=r"the models would need about .* GiB and the device has 1.0 MiB free"):
        check_memory(settings, specs, directories)


async def test_a_model_that_cannot_load_stops_the_start_naming_it(tmp_path, tiny_checkpoint):
    from service.app import create_app

    app = create_app(Settings(checkpoint=[f"good={tiny_checkpoint}", f"broken={tmp_path}"]))
    async with app.router.lifespan_context(app):
        await app.state.loading
        failure = app.state.runtime.lifecycle.failure
    assert failure is not None and failure.startswith("model broken:") and "\n" not in failure
    assert app.state.runtime.lifecycle.state == "failed"


async def test_a_colbert_beside_an_embedder_answers_as_it_does_alone(tiny_checkpoint, tiny_colbert):
    """/token-vectors and Cohere's /v1/rerank on the ColBERT (by /models/{name}/... and by `model`) equal the ColBERT
    served alone; /embed on the embedder equals the embedder alone; a ColBERT route asked of the embedder is a 4xx
    naming it."""
    query, documents = "where did the storm land", ["The storm made landfall near the coast .", "Bananas are yellow",
                                                     "A mill ( by the river ) ground wheat !"]
    vectors = {"inputs": documents}
    queries = {"inputs": query, "mode": "query"}
    rerank = {"query": query, "documents": documents, "return_documents": True}

    def ranked(response) -> list:
        assert response.status_code == 200, response.text
        return response.json()["results"]  # (its `id` is new every time)

    async with serving(["colbert=" + str(tiny_colbert)]) as client:
        alone = [(await client.post("/token-vectors", json=body)).text for body in (vectors, queries)]
        alone_rerank = ranked(await client.post("/v1/rerank", json={**rerank, "model": "colbert"}))
    async with serving([f"tiny={tiny_checkpoint}"]) as client:
        alone_embed = (await client.post("/embed", json={"inputs": documents})).text
    async with serving([f"tiny={tiny_checkpoint}", f"colbert={tiny_colbert}"]) as client:
        together = [(await client.post("/models/colbert/token-vectors", json=body)).text for body in (vectors, queries)]
        by_field = ranked(await client.post("/v1/rerank", json={**rerank, "model": "colbert"}))
        by_path = ranked(await client.post("/models/colbert/v1/rerank", json=rerank))
        tei = await client.post("/models/colbert/rerank", json={"query": query, "texts": documents})
        embed = [(await client.post(path, json={"inputs": documents})).text for path in ("/embed", "/models/tiny/embed")]
        wrong_vectors = await client.post("/token-vectors", json=vectors)  # unprefixed: the first model, the embedder
        wrong_rerank = await client.post("/v1/rerank", json={**rerank, "model": "tiny"})
        wrong_path = await client.post("/models/tiny/v2/rerank", json=rerank)
    assert together == alone  # the same bytes
    assert by_field == alone_rerank and by_path == alone_rerank
    assert [r["index"] for r in tei.json()] == [r["index"] for r in alone_rerank]
    assert embed == [alone_embed, alone_embed]
    assert wrong_vectors.status_code == 424
    assert "needs a ColBERT" in wrong_vectors.json()["error"] and "(model tiny)" in wrong_vectors.json()["error"]
    for wrong in (wrong_rerank, wrong_path):
        assert wrong.status_code == 400 and "cross-encoder" in wrong.json()["message"], wrong.text
        assert "(model tiny)" in wrong.json()["message"]
