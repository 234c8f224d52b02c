"""Every error kind, from one mapping: status, error_type, a message naming the problem, no detail leaks."""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest
import transformers

from service.engine.engine import Engine
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio


def assert_error(response, status: int, kind: str, *words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == kind
    for word in words:
        assert word in body["error"], body["error"]
    assert "Traceback" not in body["error"] and "/tmp" not in body["error"] and "detail" not in body
    return body


@pytest.mark.parametrize(
    "path, payload, words",
    [
        ("/encode", {"inputs": []}, ["inputs is empty"]),
        ("/encode", {"inputs": "   "}, ["inputs[0] is empty"]),
        ("/encode", {"inputs": 42}, ["inputs"]),
        ("/encode", {"inputs": "x", "pooling": "max"}, ["pooling"]),
        ("/encode", {"inputs": "x", "colour": "blue"}, ["colour", "Extra inputs"]),
        ("/encode", {"inputs": [["a", "b", "c"]]}, ["inputs"]),
        ("/encode", {"inputs": ["ok"] * 65}, ["65 entries", "limit is 64"]),
        ("/encode", {"inputs": "word " * 200}, ["inputs[0] is", "tokens long", "at most 128", "truncate"]),
        ("/fill-mask", {"inputs": "no mask here"}, ["has no [MASK]"]),
        ("/fill-mask", {"inputs": "[MASK]", "top_k": 0}, ["top_k", "between 1 and 100"]),
        ("/fill-mask", {"inputs": "[MASK]", "top_k": 101}, ["top_k"]),
        ("/fill-mask", {"inputs": "[MASK]", "targets": ["unbelievablyrareword"]}, ["not a single vocabulary token"]),
        ("/nsp", {"inputs": ["only one"]}, ["inputs"]),
        ("/nsp", {"inputs": [None, "b"]}, ["inputs"]),
    ],
)
async def test_validation_errors_name_the_problem(tiny_checkpoint, path, payload, words):
    async with serving(tiny_checkpoint) as client:
        assert_error(await client.post(path, json=payload), 422, "validation", *words)


async def test_transport_level_errors(tiny_checkpoint):
    async with serving(tiny_checkpoint, max_body_bytes=4096) as client:
        assert_error(await client.post("/encode", content=b'{"inputs": "a"', headers={"content-type": "application/json"}),
                     422, "validation", "not valid JSON")
        assert_error(await client.post("/encode", content=b"inputs=a", headers={"content-type": "text/plain"}),
                     415, "unsupported_media_type", "application/json")
        assert_error(await client.post("/encode", json={"inputs": "a" * 5000}), 413, "payload_too_large", "4096")

        async def chunks():  # no Content-Length: counted while reading
            for _ in range(10):
                yield b" " * 1000

        assert_error(await client.post("/encode", content=chunks(), headers={"content-type": "application/json"}),
                     413, "payload_too_large")
        assert_error(await client.get("/nope"), 404, "not_found", "/nope")
        assert_error(await client.get("/encode"), 405, "method_not_allowed")
        assert (await client.post("/encode", json={"inputs": "still fine"})).status_code == 200


async def test_api_key(tiny_checkpoint):
    async with serving(tiny_checkpoint, api_key="s3cret-key") as client:
        assert_error(await client.post("/encode", json={"inputs": "a"}), 401, "unauthorized", "Bearer")
        wrong = {"Authorization": "Bearer nope-nope"}
        assert_error(await client.post("/encode", json={"inputs": "a"}, headers=wrong), 401, "unauthorized")
        good = {"Authorization": "Bearer s3cret-key"}
        assert (await client.post("/encode", json={"inputs": "a"}, headers=good)).status_code == 200
        assert (await client.get("/health")).status_code == 200  # health stays open
        assert (await client.get("/metrics")).status_code == 200
        info = await client.get("/info", headers=good)
        assert info.json()["limits"]["api_key"] == "set"  # never the key itself
    async with serving(tiny_checkpoint, api_key="s3cret-key", metrics_require_key=True) as client:
        assert_error(await client.get("/metrics"), 401, "unauthorized")


async def test_without_the_key_nothing_but_401(tiny_checkpoint):
    """Nothing about the body is looked at before the key: size, content type, coding, JSON, fields."""
    async with serving(tiny_checkpoint, api_key="s3cret-key", max_body_bytes=4096) as client:
        json_type = {"content-type": "application/json"}

        async def chunks():  # no Content-Length: over the limit only once read
            for _ in range(10):
                yield b" " * 1000

        refused = [
            await client.post("/encode", json={"inputs": "a" * 5000}),  # 413 by its Content-Length
            await client.post("/encode", content=chunks(), headers=json_type),  # 413 once read
            await client.post("/encode", content=b"inputs=a", headers={"content-type": "text/plain"}),  # 415
            await client.post("/encode", content=b"{}", headers={**json_type, "content-encoding": "br"}),  # 415
            await client.post("/encode", content=b'{"inputs": ', headers=json_type),  # 422: not JSON
            await client.post("/encode", content=b"[" * 2000, headers=json_type),  # 422: too deep
            await client.post("/encode", json={"inputs": "a", "colour": "blue"}),  # 422: unknown field
            await client.post("/embed", content=b"{}", headers=json_type),
            await client.post("/v1/embeddings", content=b"[" * 2000, headers=json_type),
            await client.post("/", json={"inputs": "a"}, headers={"Authorization": "Bearer wrong"}),
            await client.get("/info"),
            await client.get("/v1/models"),
        ]
        for response in refused:
            assert response.status_code == 401, (response.request.url, response.text)
            assert response.headers["www-authenticate"] == "Bearer"


async def test_with_a_key_the_pages_and_probes_stay_open(tiny_checkpoint):
    """The documentation, the playground and the probes need no key (docs/configuration.md, --api-key)."""
    async with serving(tiny_checkpoint, api_key="s3cret-key") as client:
        for path in ("/health", "/live", "/metrics", "/docs", "/redoc", "/openapi.json", "/",
                     "/assets/playground/playground.js"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/info")).status_code == 401


async def test_checkpoint_without_heads_answers_unsupported(tmp_path, tiny_checkpoint):
    source = transformers.BertModel.from_pretrained(tiny_checkpoint)
    source.save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tiny_checkpoint / name, tmp_path / name)
    async with serving(tmp_path) as client:
        assert (await client.post("/encode", json={"inputs": "a"})).status_code == 200
        assert_error(await client.post("/fill-mask", json={"inputs": "[MASK]"}), 501, "unsupported", "masked-LM head")
        assert_error(await client.post("/nsp", json={"inputs": ["a", "b"]}), 501, "unsupported", "next-sentence head")
        assert_error(await client.post("/token-classification", json={"inputs": "a"}), 424, "unsupported",
                     "token-classification head")
        assert_error(await client.post("/question-answering", json={"inputs": {"question": "a", "context": "b"}}), 424,
                     "unsupported", "question-answering head")
        assert_error(await client.post("/token-vectors", json={"inputs": "a"}), 424, "unsupported", "ColBERT")
        assert (await client.get("/info")).json()["heads"] == {"mlm": False, "nsp": False, "classifier": False,
                                                               "token_classifier": False, "question_answering": False,
                                                               "late_interaction": False}


class GatedEngine(Engine):
    """Blocks inside run() until released: lets a test fill the queue deterministically."""

    gate = threading.Event()
    entered = threading.Event()

    def run(self, batch):
        self.entered.set()
        self.gate.wait(30)
        return super().run(batch)


async def test_full_queue_answers_429_with_retry_after(tiny_checkpoint):
    GatedEngine.gate.clear()
    GatedEngine.entered.clear()
    async with serving(tiny_checkpoint, engine_factory=GatedEngine, max_queue_items=3, max_batch_size=1, concurrent_batches=1,
                       warmup=False) as client:
        # The first request is on the device (blocked) before the rest arrive. Of the next nine, three fill the
        # queue and one more may already wait prepared for the device (depending on thread timing); everything
        # beyond is refused at once, not queued.
        pending = [asyncio.ensure_future(client.post("/encode", json={"inputs": "a b c"}))]
        assert await asyncio.to_thread(GatedEngine.entered.wait, 10)
        pending += [asyncio.ensure_future(client.post("/encode", json={"inputs": "a b c"})) for _ in range(9)]
        try:
            await asyncio.sleep(0.5)
            refused = [p.result() for p in pending if p.done()]
            assert len(refused) in (5, 6)
            for response in refused:
                assert_error(response, 429, "overloaded", "queue is full")
                assert int(response.headers["retry-after"]) >= 1
        finally:
            GatedEngine.gate.set()
        accepted = [p for p in pending if not p.done()]
        assert [r.status_code for r in await asyncio.gather(*accepted)] == [200] * len(accepted)


async def test_concurrency_cap_refuses_at_once_before_parsing_the_body(tiny_checkpoint):
    GatedEngine.gate.clear()
    GatedEngine.entered.clear()
    async with serving(tiny_checkpoint, engine_factory=GatedEngine, max_concurrent_requests=2, max_batch_size=1,
                       concurrent_batches=1, warmup=False) as client:
        held = [asyncio.ensure_future(client.post("/encode", json={"inputs": "a b c"})) for _ in range(2)]
        assert await asyncio.to_thread(GatedEngine.entered.wait, 10)
        try:
            # Refused by the cap even though the body is not JSON: it is read (admission counts a request once its
            # body is in) but never parsed.
            for body in ({"inputs": "third"}, "not json at all"):
                refused = await client.post("/nsp", content=body if isinstance(body, str) else None,
                                            json=body if isinstance(body, dict) else None,
                                            headers={"content-type": "application/json"})
                assert_error(refused, 429, "overloaded", "2 requests are being handled")
                assert refused.headers["retry-after"] == "1"
            assert (await client.get("/health")).status_code == 200  # only the JSON routes are capped
        finally:
            GatedEngine.gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        # The slots are free again.
        assert (await client.post("/encode", json={"inputs": "after"})).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'bert_request_failures_total{error_type="overloaded",model="tiny",route="/nsp"} 2.0' in metrics


async def test_queue_deadline_answers_503_and_skips_compute(tiny_checkpoint):
    GatedEngine.gate.clear()
    GatedEngine.entered.clear()
    async with serving(tiny_checkpoint, engine_factory=GatedEngine, max_batch_size=1, queue_timeout_s=0.3, concurrent_batches=1,
                       warmup=False) as client:
        blockers = [asyncio.ensure_future(client.post("/encode", json={"inputs": "first"})) for _ in range(2)]
        assert await asyncio.to_thread(GatedEngine.entered.wait, 10)
        late = await client.post("/encode", json={"inputs": "waits too long"})
        assert_error(late, 503, "unavailable", "deadline")
        GatedEngine.gate.set()
        await asyncio.gather(*blockers)
        metrics = (await client.get("/metrics")).text
    assert 'bert_items_dropped_total{model="tiny",reason="deadline"} 1.0' in metrics
    assert 'bert_items_computed_total{model="tiny"} 2.0' in metrics  # the late item never reached the device


class FailingEngine(Engine):
    """Raises for any batch containing the word 'boom'; fine otherwise."""

    def run(self, batch):
        if any(self.boom_id in item.input_ids for item in batch.items):
            raise RuntimeError("simulated device fault")
        return super().run(batch)


async def test_engine_failure_fails_only_its_batch(tiny_checkpoint):
    from model import load_checkpoint

    FailingEngine.boom_id = load_checkpoint(tiny_checkpoint).tokenizer.token_to_id("the")
    async with serving(tiny_checkpoint, engine_factory=FailingEngine, max_batch_size=1) as client:
        bad = await client.post("/encode", json={"inputs": "the boom"})
        body = assert_error(bad, 500, "internal", "internal error")
        assert "simulated" not in body["error"]  # logged, not shown
        good = await client.post("/encode", json={"inputs": "a river"})
        assert good.status_code == 200
        assert (await client.get("/health")).status_code == 200


class OutOfMemoryAbove(Engine):
    """Raises CUDA-style out-of-memory for batches over two sequences."""

    calls: list[int] = []

    def run(self, batch):
        self.calls.append(len(batch.items))
        if len(batch.items) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().run(batch)


async def test_out_of_memory_batches_are_split_and_answered(tiny_checkpoint):
    texts = [f"sentence number {i} about the river" for i in range(8)]
    # One runner: with two, the request would be split over both before any batch ran out of memory.
    async with serving(tiny_checkpoint, engine_factory=OutOfMemoryAbove, warmup=False, concurrent_batches=1) as client:
        alone = [(await client.post("/encode", json={"inputs": t, "pooling": "mean"})).json() for t in texts]
        OutOfMemoryAbove.calls.clear()
        together = await client.post("/encode", json={"inputs": texts, "pooling": "mean"})
        metrics = (await client.get("/metrics")).text
    assert together.status_code == 200
    assert OutOfMemoryAbove.calls == [8, 4, 2, 2, 4, 2, 2]  # halved until each part fits
    for got, want in zip(together.json()["results"], alone):
        assert max(abs(a - b) for a, b in zip(got["embedding"], want["results"][0]["embedding"])) < 1e-5
    assert "bert_batch_splits_total" in metrics and "bert_batch_splits_total 0.0" not in metrics


async def test_not_ready_and_shutting_down_answer_503(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        lifecycle = client.app.state.runtime.lifecycle
        lifecycle.drain()
        assert_error(await client.get("/health"), 503, "unavailable", "shutting down")
        assert_error(await client.post("/encode", json={"inputs": "a"}), 503, "unavailable")
        lifecycle.state = "loading"  # as before the model is loaded
        assert_error(await client.get("/health"), 503, "unavailable", "loading")
        lifecycle.ready()
