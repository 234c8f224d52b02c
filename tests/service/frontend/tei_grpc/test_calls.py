"""Every call of tei.v1 that a checkpoint can answer equals the answer of the HTTP route that does the same, on
real servers in both process arrangements (--workers 2: the engine process and two front ends; --workers 0: one
process): the bundled model (embeddings, sparse vectors, tokens), a classifier and a cross-encoder. Streams carry
many messages, each answered in order. Numbers are compared within float32 rounding (`close`): an input computed in
another batch than its HTTP twin may differ in the last bit or two."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from service.settings import DEFAULT_CHECKPOINT
from tests.service.frontend.tei_grpc.conftest import real_server, stubs

TEXTS = ["a crane is flying over the river", "the album sold well in its first week", "Berlin is the capital",
         "the storm moved north and weakened over land", "he brushed his teeth before going to bed"]


@pytest.fixture(scope="module", params=["2", "0"], ids=["workers-2", "workers-0"])
def bundled(request):
    # float32 whatever this CPU's default: in bfloat16 an input batched with others may differ from its twin by a
    # bfloat16 rounding on CPUs with AMX (docs/precision.md), which would hide nothing here but widen every comparison
    server = real_server(DEFAULT_CHECKPOINT, "--workers", request.param, "--dtype", "float32")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def classifier(tiny_classifier):
    server = real_server(tiny_classifier, "--workers", "0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cross_encoder(tiny_cross_encoder):
    server = real_server(tiny_cross_encoder, "--workers", "2")
    yield server
    server.stop()


def post(server, path: str, body: dict):
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def as_f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def close(got, want, message: str = "") -> None:
    np.testing.assert_allclose(as_f32(got), as_f32(want), rtol=1e-5, atol=1e-6, err_msg=message)


def test_embed_and_its_stream_equal_http_embed(tei, bundled):
    with grpc.insecure_channel(bundled.target) as channel:
        call = stubs(tei, channel)
        for options in ({}, {"normalize": False}, {"dimensions": 64}, {"truncate": True, "truncation_direction": 1}):
            http_options = {**options}
            if "truncation_direction" in options:
                http_options["truncation_direction"] = "left"
            want = post(bundled, "/embed", {"inputs": TEXTS, **http_options})
            for text, vector in zip(TEXTS, want):
                got = call.embed.Embed(tei.pb.EmbedRequest(inputs=text, **options))
                close(got.embeddings, vector, str(options))
                assert got.metadata.compute_chars == len(text) and got.metadata.compute_tokens > 2
        # A stream of many messages: every answer, in the order sent.
        texts = [f"{TEXTS[i % len(TEXTS)]} number {i}" for i in range(300)]
        answers = list(call.embed.EmbedStream(iter(tei.pb.EmbedRequest(inputs=t) for t in texts)))
        want = [v for k in range(0, len(texts), 64) for v in post(bundled, "/embed", {"inputs": texts[k:k + 64]})]
        assert len(answers) == len(texts)
        for got, vector in zip(answers, want, strict=True):
            close(got.embeddings, vector)


def test_embed_all_and_sparse_equal_http(tei, bundled):
    with grpc.insecure_channel(bundled.target) as channel:
        call = stubs(tei, channel)
        for text in TEXTS[:3]:
            want = post(bundled, "/embed_all", {"inputs": text})[0]
            got = call.embed.EmbedAll(tei.pb.EmbedAllRequest(inputs=text))
            close(np.stack([as_f32(t.embeddings) for t in got.token_embeddings]), want)
            sparse = post(bundled, "/embed_sparse", {"inputs": text})[0]
            got = call.embed.EmbedSparse(tei.pb.EmbedSparseRequest(inputs=text))
            assert [v.index for v in got.sparse_embeddings] == [v["index"] for v in sparse]
            close([v.value for v in got.sparse_embeddings], [v["value"] for v in sparse])
        streamed = list(call.embed.EmbedAllStream(iter(tei.pb.EmbedAllRequest(inputs=t) for t in TEXTS)))
        assert [len(s.token_embeddings) for s in streamed] == [len(v) for v in post(bundled, "/embed_all",
                                                                                    {"inputs": TEXTS})]
        streamed = list(call.embed.EmbedSparseStream(iter(tei.pb.EmbedSparseRequest(inputs=t) for t in TEXTS)))
        assert [[v.index for v in s.sparse_embeddings] for s in streamed] == \
            [[v["index"] for v in s] for s in post(bundled, "/embed_sparse", {"inputs": TEXTS})]


def test_tokenize_decode_and_info_equal_http(tei, bundled):
    with grpc.insecure_channel(bundled.target) as channel:
        call = stubs(tei, channel)
        for special in (True, False):
            want = post(bundled, "/tokenize", {"inputs": TEXTS, "add_special_tokens": special})
            streamed = list(call.tokenize.TokenizeStream(
                iter(tei.pb.EncodeRequest(inputs=t, add_special_tokens=special) for t in TEXTS)))
            for text, tokens, stream_answer in zip(TEXTS, want, streamed):
                got = call.tokenize.Tokenize(tei.pb.EncodeRequest(inputs=text, add_special_tokens=special))
                for answer in (got, stream_answer):
                    assert [{"id": t.id, "text": t.text, "special": t.special,
                             "start": t.start if t.HasField("start") else None,
                             "stop": t.stop if t.HasField("stop") else None} for t in answer.tokens] == tokens
        ids = [t["id"] for t in post(bundled, "/tokenize", {"inputs": TEXTS[0]})[0]]
        for skip in (True, False):
            want = post(bundled, "/decode", {"ids": ids, "skip_special_tokens": skip})[0]
            assert call.tokenize.Decode(tei.pb.DecodeRequest(ids=ids, skip_special_tokens=skip)).text == want
            assert [a.text for a in call.tokenize.DecodeStream(iter([tei.pb.DecodeRequest(
                ids=ids, skip_special_tokens=skip)] * 3))] == [want] * 3
        info = httpx.get(bundled.url + "/info").json()
        got = call.info.Info(tei.pb.InfoRequest())
        assert (got.model_id, got.model_dtype, got.max_input_length, got.max_batch_tokens, got.max_client_batch_size,
                got.max_concurrent_requests, got.version) == (
            info["model_id"], info["model_dtype"], info["max_input_length"], info["max_batch_tokens"],
            info["max_client_batch_size"], info["max_concurrent_requests"], info["version"])
        assert got.model_type == tei.pb.MODEL_TYPE_EMBEDDING and not got.HasField("sha")


def test_calls_the_bundled_model_has_no_head_for_fail_as_tei_does(tei, bundled):
    """Predict and Rerank need a classifier: FAILED_PRECONDITION (TEI's Backend type), naming what it has."""
    with grpc.insecure_channel(bundled.target) as channel:
        call = stubs(tei, channel)
        for attempt in (lambda: call.predict.Predict(tei.pb.PredictRequest(inputs="a text")),
                        lambda: call.predict.PredictPair(tei.pb.PredictPairRequest(inputs=["a", "b"])),
                        lambda: call.rerank.Rerank(tei.pb.RerankRequest(query="q", texts=["a"])),
                        lambda: call.rerank.RerankStream(iter([tei.pb.RerankStreamRequest(query="q", text="a")]))):
            with pytest.raises(grpc.RpcError) as failed:
                attempt()
            assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "masked-LM head" in failed.value.details()
        assert httpx.post(bundled.url + "/predict", json={"inputs": "a text"}).status_code == 424


def test_predict_equals_http_predict_on_a_classifier(tei, classifier):
    texts = TEXTS[:4]
    with grpc.insecure_channel(classifier.target) as channel:
        call = stubs(tei, channel)
        for raw in (False, True):
            want = post(classifier, "/predict", {"inputs": texts, "raw_scores": raw})
            streamed = list(call.predict.PredictStream(iter(tei.pb.PredictRequest(inputs=t, raw_scores=raw)
                                                            for t in texts)))
            for text, predictions, stream_answer in zip(texts, want, streamed):
                for got in (call.predict.Predict(tei.pb.PredictRequest(inputs=text, raw_scores=raw)),
                            call.predict.PredictPair(tei.pb.PredictPairRequest(inputs=[text], raw_scores=raw)),
                            stream_answer):
                    assert [p.label for p in got.predictions] == [p["label"] for p in predictions]
                    close([p.score for p in got.predictions], [p["score"] for p in predictions])
        assert call.info.Info(tei.pb.InfoRequest()).model_type == tei.pb.MODEL_TYPE_CLASSIFIER
        with pytest.raises(grpc.RpcError) as failed:
            call.predict.PredictPair(tei.pb.PredictPairRequest(inputs=["a", "b", "c"]))
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_rerank_and_pairs_equal_http_on_a_cross_encoder(tei, cross_encoder):
    query, texts = "how old is the tower", TEXTS
    with grpc.insecure_channel(cross_encoder.target) as channel:
        call = stubs(tei, channel)
        for raw, with_text in ((False, False), (True, True)):
            want = post(cross_encoder, "/rerank", {"query": query, "texts": texts, "raw_scores": raw,
                                                    "return_text": with_text})
            unary = call.rerank.Rerank(tei.pb.RerankRequest(query=query, texts=texts, raw_scores=raw,
                                                            return_text=with_text))
            streamed = call.rerank.RerankStream(iter(
                tei.pb.RerankStreamRequest(query=query, text=t, raw_scores=raw, return_text=with_text) for t in texts))
            for got in (unary, streamed):
                assert [r.index for r in got.ranks] == [r["index"] for r in want]
                close([r.score for r in got.ranks], [r["score"] for r in want])
                assert [r.text if r.HasField("text") else None for r in got.ranks] == [r.get("text") for r in want]
            assert streamed.metadata.compute_tokens == unary.metadata.compute_tokens
        pairs = post(cross_encoder, "/predict", {"inputs": [[query, t] for t in texts]})
        streamed = list(call.predict.PredictPairStream(iter(tei.pb.PredictPairRequest(inputs=[query, t])
                                                            for t in texts)))
        for got, want in zip(streamed, pairs):
            close([p.score for p in got.predictions], [p["score"] for p in want])
        assert call.info.Info(tei.pb.InfoRequest()).model_type == tei.pb.MODEL_TYPE_RERANKER
