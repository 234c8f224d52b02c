"""What the gRPC API answers besides results: TEI's status code with a message for every bad request (never INTERNAL
for anything a client sends), the API key, admission, the client's deadline, cancellation, a stream that fails
mid-way, metrics, health and reflection. In-process servers (the gRPC server on the test's event loop), some over an
engine that blocks until released."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.service.frontend.tei_grpc.conftest import in_process, stubs
from tests.service.frontend.test_errors import GatedEngine  # blocks inside run() until released

pytestmark = pytest.mark.anyio
INVALID, UNAVAILABLE = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE


def gated():
    GatedEngine.gate.clear()
    GatedEngine.entered.clear()
    return GatedEngine


async def fails(call, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    assert failed.value.code() == code, (failed.value.code(), failed.value.details())
    for word in words:
        assert word in failed.value.details(), failed.value.details()
    return failed.value.details()


async def test_bad_messages_get_teis_codes_with_a_message_and_lose_nothing(tei, tiny_checkpoint):
    async with in_process(tiny_checkpoint, max_input_chars=400) as server:
        call = stubs(tei, server.channel)
        raw = server.channel.unary_unary("/tei.v1.Embed/Embed")
        await fails(raw(b"\x0a\xff\xff"), INVALID, "not a valid tei.v1.EmbedRequest")  # truncated
        await fails(raw(b"\x0a\x02\xc3\x28"), INVALID, "not a valid")  # invalid UTF-8 in a string field
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="")), INVALID, "empty")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="x" * 401)), INVALID, "401 characters")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="a", dimensions=0)), INVALID, "dimensions")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="a", dimensions=10**6)), INVALID, "dimensions")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="a", truncation_direction=9)), INVALID,
                    "truncation_direction 9")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="a", prompt_name="query")), INVALID, "prompt_name")
        await fails(call.tokenize.Decode(tei.pb.DecodeRequest(ids=[10**9])), INVALID, "outside the vocabulary")
        await fails(call.tokenize.Decode(tei.pb.DecodeRequest()), INVALID, "ids is empty")
        await fails(call.predict.Predict(tei.pb.PredictRequest(inputs="a")), grpc.StatusCode.FAILED_PRECONDITION,
                    "classification")
        long = " ".join(["w"] * 150)  # past the tiny model's 128 positions
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs=long)), INVALID, "tokens long")
        assert len((await call.embed.Embed(tei.pb.EmbedRequest(inputs=long, truncate=True))).embeddings) == 64
        # A method outside tei.v1: the library's UNIMPLEMENTED.
        await fails(server.channel.unary_unary("/tei.v1.Embed/Nothing")(b""), grpc.StatusCode.UNIMPLEMENTED)
        # Nothing was lost: the server answers as before.
        assert len((await call.embed.Embed(tei.pb.EmbedRequest(inputs="a river"))).embeddings) == 64
        metrics = (await server.http.get("/metrics")).text
    assert 'bert_requests_total{model="tiny",route="/tei.v1.Embed/Embed",status="INVALID_ARGUMENT"} 9.0' in metrics
    assert 'bert_request_failures_total{error_type="validation",model="tiny",route="/tei.v1.Embed/Embed"}' in metrics
    assert 'bert_requests_total{model="tiny",route="/tei.v1.Embed/Embed",status="OK"} 2.0' in metrics


async def test_a_stream_answers_every_message_before_a_bad_one_then_ends_with_its_code(tei, tiny_checkpoint):
    async with in_process(tiny_checkpoint) as server:
        call = stubs(tei, server.channel)
        texts = [f"sentence {i}" for i in range(40)] + [""] + ["never answered"] * 5
        stream = call.embed.EmbedStream(tei.pb.EmbedRequest(inputs=t) for t in texts)
        answers = []
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for answer in stream:
                answers.append(answer)
        assert failed.value.code() == INVALID and "empty" in failed.value.details()
        assert len(answers) == 40 and all(len(a.embeddings) == 64 for a in answers)
        # A message that does not parse, mid-stream, the same way.
        raw = server.channel.stream_stream("/tei.v1.Tokenize/TokenizeStream")
        good = tei.pb.EncodeRequest(inputs="a river").SerializeToString()
        answers = []
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for answer in raw(iter([good, good, b"\x12\xff", good])):
                answers.append(answer)
        assert failed.value.code() == INVALID and len(answers) == 2
        # Another client, meanwhile and after, is unaffected.
        assert len((await call.embed.Embed(tei.pb.EmbedRequest(inputs="a river"))).embeddings) == 64


async def test_the_api_key_is_checked_first_and_health_and_reflection_stay_open(tei, tiny_checkpoint):
    key = "secret-key-123"
    async with in_process(tiny_checkpoint, api_key=key) as server:
        call = stubs(tei, server.channel)
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="a")), grpc.StatusCode.UNAUTHENTICATED, "API key")
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs=""), metadata=(("authorization", "Bearer wrong"),)),
                    grpc.StatusCode.UNAUTHENTICATED)  # the key before the message's own checks
        await fails(call.info.Info(tei.pb.InfoRequest()), grpc.StatusCode.UNAUTHENTICATED)
        stream = call.embed.EmbedStream(iter([tei.pb.EmbedRequest(inputs="a")]))
        await fails(stream.read(), grpc.StatusCode.UNAUTHENTICATED)
        keyed = (("authorization", f"Bearer {key}"),)
        assert len((await call.embed.Embed(tei.pb.EmbedRequest(inputs="a"), metadata=keyed)).embeddings) == 64
        health = health_pb2_grpc.HealthStub(server.channel)
        deadline = time.monotonic() + 5  # the health service follows the server's state within HEALTH_EVERY_S
        while (await health.Check(health_pb2.HealthCheckRequest(service="tei.v1.Embed"))).status != \
                health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "never SERVING"
            await asyncio.sleep(0.1)
        for service, want in (("", "SERVING"), ("tei.v1.Info", "SERVING"), ("tei.v1.Tokenize", "SERVING"),
                              ("tei.v1.Predict", "NOT_SERVING"), ("tei.v1.Rerank", "NOT_SERVING")):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status) == want, service
        reflect = reflection_pb2_grpc.ServerReflectionStub(server.channel)
        listed = [answer async for answer in reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
        names = {s.name for s in listed[0].list_services_response.service}
        assert {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize",
                "grpc.health.v1.Health"} <= names
        found = [answer async for answer in reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed")]))]
        assert found[0].file_descriptor_response.file_descriptor_proto  # the served descriptor itself


async def test_admission_refuses_a_call_at_once_and_makes_a_stream_wait(tei, tiny_checkpoint):
    engine = gated()
    async with in_process(tiny_checkpoint, engine_factory=engine, max_concurrent_requests=2, max_batch_size=1,
                          concurrent_batches=1, warmup=False) as server:
        call = stubs(tei, server.channel)
        held = [asyncio.ensure_future(call.embed.Embed(tei.pb.EmbedRequest(inputs=f"held {i}"))) for i in range(2)]
        assert await asyncio.to_thread(engine.entered.wait, 10)
        await asyncio.sleep(0.2)
        try:
            await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="third")), grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "2 requests are being handled")
            assert (await server.http.post("/embed", json={"inputs": "x"})).status_code == 429  # one count for both
            # A stream is not refused: it waits for a slot, then is answered.
            stream = call.embed.EmbedStream(iter([tei.pb.EmbedRequest(inputs="streamed")]))
            waiting = asyncio.ensure_future(stream.read())
            await asyncio.sleep(0.3)
            assert not waiting.done()
        finally:
            engine.gate.set()
        assert [len(h.embeddings) for h in await asyncio.gather(*held)] == [64, 64]
        assert len((await waiting).embeddings) == 64
        assert server.runtime.requests.accepted >= 4


async def test_the_clients_deadline_is_the_requests_and_what_it_queued_is_dropped(tei, tiny_checkpoint):
    engine = gated()
    async with in_process(tiny_checkpoint, engine_factory=engine, max_batch_size=1, concurrent_batches=1,
                          warmup=False) as server:
        call = stubs(tei, server.channel)
        blocker = asyncio.ensure_future(call.embed.Embed(tei.pb.EmbedRequest(inputs="on the device")))
        assert await asyncio.to_thread(engine.entered.wait, 10)
        started = time.monotonic()
        await fails(call.embed.Embed(tei.pb.EmbedRequest(inputs="waits"), timeout=0.5),
                    grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - started < 5.0  # not the server's 30 s queue deadline
        await asyncio.sleep(0.2)
        engine.gate.set()
        assert len((await blocker).embeddings) == 64
        await asyncio.sleep(0.2)
        metrics = (await server.http.get("/metrics")).text
    # The late input never reached the device: dropped from the queue (its call ended), not computed.
    dropped = [line for line in metrics.splitlines() if line.startswith("bert_items_dropped_total")]
    assert sum(float(line.split()[-1]) for line in dropped) == 1.0, dropped
    assert 'bert_items_computed_total{model="tiny"} 1.0' in metrics


async def test_a_cancelled_stream_drops_its_queued_inputs_and_frees_its_slots(tei, tiny_checkpoint):
    engine = gated()
    async with in_process(tiny_checkpoint, engine_factory=engine, max_batch_size=1, concurrent_batches=1,
                          warmup=False, grpc_stream_window=8) as server:
        call = stubs(tei, server.channel)
        stream = call.embed.EmbedStream(tei.pb.EmbedRequest(inputs=f"message {i}") for i in range(20))
        reading = asyncio.ensure_future(stream.read())
        assert await asyncio.to_thread(engine.entered.wait, 10)
        await asyncio.sleep(0.3)
        assert server.runtime.link.models.batcher("").queue_depth >= 5  # the window's messages wait in the queue
        stream.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await asyncio.sleep(0.3)
        engine.gate.set()
        await asyncio.sleep(0.5)
        # Nothing of the stream holds an admission slot; its queued inputs were dropped, not computed.
        admitted = server.app.state.runtime  # the HTTP side's count is the same object the gRPC server uses
        assert (await server.http.post("/embed", json={"inputs": "after"})).status_code == 200
        metrics = (await server.http.get("/metrics")).text
        assert admitted.requests.answered >= 1
    computed = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("bert_items_computed_total"))
    assert computed <= 3, computed  # the one on the device, perhaps one prepared, and the HTTP request after
    assert 'bert_items_dropped_total{model="tiny",reason="disconnected"}' in metrics


async def test_a_stream_that_sends_nothing_ends_after_keep_alive(tei, tiny_checkpoint):
    async with in_process(tiny_checkpoint, keep_alive_s=0.5) as server:
        call = stubs(tei, server.channel)
        stream = call.embed.EmbedStream()
        await stream.write(tei.pb.EmbedRequest(inputs="one"))
        assert len((await stream.read()).embeddings) == 64
        started = time.monotonic()
        details = await fails(stream.read(), grpc.StatusCode.DEADLINE_EXCEEDED, "sent no message")
        assert 0.4 < time.monotonic() - started < 3.0, details
        assert len((await call.embed.Embed(tei.pb.EmbedRequest(inputs="a"))).embeddings) == 64
