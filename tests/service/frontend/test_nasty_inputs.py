"""A table of nasty inputs, each with the status and error_type it must get; afterwards the same
well-formed request still gets the same answer."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from tests.service.conftest import serving

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}
WELL_FORMED = ("/encode", {"inputs": ["a crane is flying", ["the river", "flows south"]], "pooling": "mean"})

DEEP = b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}"  # 4 KB
HUGE_INT = b"9" * 4301  # past Python's int-from-text limit
GZIP = {**JSON, "content-encoding": "gzip"}
ZIP_BOMB = gzip.compress(b'{"inputs": "' + b"a " * 1_500_000 + b'"}')  # 3 MB inflated, a few KB sent
# (name, path, body: a dict sent as JSON or raw bytes, headers, expected status, expected error_type or None)
CASES = [
    ("empty string", "/encode", {"inputs": ""}, JSON, 422, "validation"),
    ("empty list", "/encode", {"inputs": []}, JSON, 422, "validation"),
    ("whitespace only", "/encode", {"inputs": " \t\n "}, JSON, 422, "validation"),
    ("only special tokens", "/encode", {"inputs": "[CLS] [SEP] [PAD]"}, JSON, 200, None),
    ("[MASK] alone", "/fill-mask", {"inputs": "[MASK]"}, JSON, 200, None),
    ("20 masks", "/fill-mask", {"inputs": " ".join(["[MASK]"] * 20)}, JSON, 200, None),
    ("a text of 1 MB", "/encode", {"inputs": "word " * 200_000}, JSON, 422, "validation"),
    ("a body over the size limit", "/encode", {"inputs": ["x" * 40_000] * 60}, JSON, 413, "payload_too_large"),
    ("10,000 inputs", "/encode", {"inputs": ["hi"] * 10_000}, JSON, 422, "validation"),
    ("lists three deep", "/encode", {"inputs": [[["a", "b"]]]}, JSON, 422, "validation"),
    ("a pair of three", "/nsp", {"inputs": [["a", "b", "c"]]}, JSON, 422, "validation"),
    ("a pair of one", "/nsp", {"inputs": [["a"]]}, JSON, 422, "validation"),
    ("a number for a string", "/encode", {"inputs": 42}, JSON, 422, "validation"),
    ("null for a string", "/encode", {"inputs": None}, JSON, 422, "validation"),
    ("null inside the list", "/encode", {"inputs": ["a", None]}, JSON, 422, "validation"),
    ("a number inside a pair", "/nsp", {"inputs": [["a", 3]]}, JSON, 422, "validation"),
    ("invalid UTF-8", "/encode", b'{"inputs": "caf\xe9 \xff\xfe"}', JSON, 422, "validation"),
    ("lone surrogate", "/encode", b'{"inputs": "broken \\ud800 pair"}', JSON, 422, "validation"),
    ("control characters", "/encode", {"inputs": "bell\x07 null\x00 escape\x1b end"}, JSON, 200, None),
    ("emoji and CJK", "/encode", {"inputs": "🙂🚀 東京は晴れ 한국어"}, JSON, 200, None),
    ("right-to-left text", "/encode", {"inputs": "\u202eשלום עולם مرحبا"}, JSON, 200, None),
    ("top_k 0", "/fill-mask", {"inputs": "[MASK]", "top_k": 0}, JSON, 422, "validation"),
    ("top_k -1", "/fill-mask", {"inputs": "[MASK]", "top_k": -1}, JSON, 422, "validation"),
    ("top_k 10^9", "/fill-mask", {"inputs": "[MASK]", "top_k": 10**9}, JSON, 422, "validation"),
    ("top_k a string", "/fill-mask", {"inputs": "[MASK]", "top_k": "five"}, JSON, 422, "validation"),
    ("an unknown field", "/encode", {"inputs": "a", "temperature": 2}, JSON, 422, "validation"),
    ("wrong content type", "/encode", b'{"inputs": "a"}', {"content-type": "text/plain"}, 415, "unsupported_media_type"),
    ("no content type", "/encode", b'{"inputs": "a"}', {}, 415, "unsupported_media_type"),
    ("a body that is not JSON", "/encode", b"inputs=a", JSON, 422, "validation"),
    ("a truncated body", "/encode", b'{"inputs": ["a crane", "is fly', JSON, 422, "validation"),
    ("an empty body", "/encode", b"", JSON, 422, "validation"),
    ("JSON that is not an object", "/encode", b'["a", "b"]', JSON, 422, "validation"),
    ("a target of two pieces", "/fill-mask", {"inputs": "[MASK]", "targets": ["notaword123"]}, JSON, 422, "validation"),
    # OpenAI-compatible: 400 with OpenAI's error type
    ("openai: empty string", "/v1/embeddings", {"input": ""}, JSON, 400, "invalid_request_error"),
    ("openai: token ids", "/v1/embeddings", {"input": [1, 2, 3]}, JSON, 400, "invalid_request_error"),
    ("openai: nested token ids", "/v1/embeddings", {"input": [[1, 2], [3]]}, JSON, 400, "invalid_request_error"),
    ("openai: a number", "/v1/embeddings", {"input": 7}, JSON, 400, "invalid_request_error"),
    ("openai: no input", "/v1/embeddings", {"model": "m"}, JSON, 400, "invalid_request_error"),
    ("openai: dimensions 0", "/v1/embeddings", {"input": "a", "dimensions": 0}, JSON, 400, "invalid_request_error"),
    ("openai: dimensions past the width", "/v1/embeddings", {"input": "a", "dimensions": 65}, JSON, 400,
     "invalid_request_error"),
    ("openai: fewer dimensions", "/v1/embeddings", {"input": "a", "dimensions": 3}, JSON, 200, None),
    ("openai alias: token ids", "/embeddings", {"input": [1, 2, 3]}, JSON, 400, "invalid_request_error"),
    ("openai: unknown encoding", "/v1/embeddings", {"input": "a", "encoding_format": "int8"}, JSON, 400,
     "invalid_request_error"),
    ("openai: 10,000 inputs", "/v1/embeddings", {"input": ["hi"] * 10_000}, JSON, 400, "invalid_request_error"),
    ("openai: emoji", "/v1/embeddings", {"input": "🙂🚀 東京"}, JSON, 200, None),
    ("openai: not JSON", "/v1/embeddings", b"input=a", JSON, 400, "invalid_request_error"),
    ("openai: wrong content type", "/v1/embeddings", b'{"input": "a"}', {"content-type": "text/plain"}, 415,
     "invalid_request_error"),
    # TEI-compatible: TEI's error body and types
    ("tei: empty list", "/embed", {"inputs": []}, JSON, 400, "Empty"),
    ("tei: token ids", "/embed", {"inputs": [1, 2]}, JSON, 200, None),
    ("tei: token ids past the vocabulary", "/embed", {"inputs": [1, 10**6]}, JSON, 422, "Validation"),
    ("tei: negative token id", "/embed", {"inputs": [[5, -1]]}, JSON, 422, "Validation"),
    ("tei: an empty id list in a batch", "/embed", {"inputs": ["a", []]}, JSON, 422, "Validation"),
    ("tei: booleans as ids", "/embed", {"inputs": [True, False]}, JSON, 422, "Validation"),
    ("tei: unknown prompt name", "/embed", {"inputs": "a", "prompt_name": "query"}, JSON, 422, "Validation"),
    ("tei: left truncation", "/embed_all", {"inputs": "a", "truncation_direction": "left"}, JSON, 200, None),
    ("tei: sideways truncation", "/embed_all", {"inputs": "a", "truncation_direction": "up"}, JSON, 422, "Validation"),
    ("tei: dimensions 0", "/embed", {"inputs": "a", "dimensions": 0}, JSON, 422, "Validation"),
    ("tei: dimensions past the width", "/embed", {"inputs": "a", "dimensions": 10**6}, JSON, 422, "Validation"),
    ("tei: 65 inputs", "/embed", {"inputs": ["a"] * 65}, JSON, 422, "Validation"),
    ("tei: decode nothing", "/decode", {"ids": []}, JSON, 400, "Empty"),
    ("tei: decode an id past the vocabulary", "/decode", {"ids": [[1, 99999999]]}, JSON, 422, "Validation"),
    ("tei: similarity with no sentences", "/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, JSON,
     400, "Empty"),
    ("tei: similarity without a source", "/similarity", {"inputs": {"sentences": ["a"]}}, JSON, 422, "Validation"),
    ("tei: predict without a classifier", "/predict", {"inputs": "a"}, JSON, 424, "Backend"),
    ("tei: rerank without a cross-encoder", "/rerank", {"query": "a", "texts": ["b"]}, JSON, 424, "Backend"),
    ("root: an object of no task", "/", {"inputs": {"question": "a"}}, JSON, 422, "Validation"),
    ("root: masks in some inputs only", "/", {"inputs": ["a [MASK]", "b"]}, JSON, 422, "Validation"),
    ("root: fill-mask top_k 0", "/", {"inputs": "a [MASK]", "parameters": {"top_k": 0}}, JSON, 422, "Validation"),
    ("root: unknown parameter", "/", {"inputs": "a", "temperature": 1}, JSON, 422, "Validation"),
    ("root: no inputs", "/", {"normalize": True}, JSON, 422, "Validation"),
    ("root: base64 vectors", "/", {"inputs": "a", "encoding_format": "base64"}, JSON, 422, "Validation"),
    ("root: not an object", "/invocations", b'["a"]', JSON, 422, "Validation"),
    ("tei: a text of 1 MB", "/embed_all", {"inputs": "word " * 200_000}, JSON, 422, "Validation"),
    ("tei: too long without truncate", "/embed", {"inputs": "word " * 400}, JSON, 422, "Validation"),
    ("tei: too long, truncated", "/embed", {"inputs": "word " * 400, "truncate": True}, JSON, 200, None),
    ("tei: tokenize whitespace", "/tokenize", {"inputs": "   "}, JSON, 422, "Validation"),
    ("tei: tokenize control characters", "/tokenize", {"inputs": "bell\x07 nul\x00"}, JSON, 200, None),
    ("tei: tokenize a number", "/tokenize", {"inputs": 3}, JSON, 422, "Validation"),
    # Bodies the parser must refuse with a 4xx, whatever the route (each was a 500, or TEI's 424, before)
    ("nested 2,000 deep", "/encode", DEEP, JSON, 422, "validation"),
    ("openai: nested 2,000 deep", "/v1/embeddings", DEEP.replace(b"inputs", b"input"), JSON, 400,
     "invalid_request_error"),
    ("tei: nested 2,000 deep", "/embed", DEEP, JSON, 422, "Validation"),
    ("root: nested 2,000 deep", "/", DEEP, JSON, 422, "Validation"),
    ("nested 2,000 deep in an unknown field", "/nsp", b'{"inputs": ["a", "b"], "x": ' + b"[" * 2000 + b"]" * 2000
     + b"}", JSON, 422, "validation"),
    ("a 4,301-digit top_k", "/fill-mask", b'{"inputs": "[MASK]", "top_k": ' + HUGE_INT + b"}", JSON, 422, "validation"),
    ("a 4,301-digit unknown field", "/encode", b'{"inputs": "a", "n": ' + HUGE_INT + b"}", JSON, 422, "validation"),
    ("tei: a 4,301-digit token id", "/embed", b'{"inputs": [101, ' + HUGE_INT + b"]}", JSON, 422, "Validation"),
    ("a 25-digit top_k", "/fill-mask", b'{"inputs": "[MASK]", "top_k": 1234567890123456789012345}', JSON, 422,
     "validation"),
    ("NaN for a number", "/fill-mask", b'{"inputs": "[MASK]", "top_k": NaN}', JSON, 422, "validation"),
    ("a lone surrogate in targets", "/fill-mask", b'{"inputs": "[MASK]", "targets": ["a\\ud800"]}', JSON, 422,
     "validation"),
    ("tei: a lone surrogate in the rerank query", "/rerank", b'{"query": "\\udc00", "texts": ["b"]}', JSON, 422,
     "Validation"),
    ("tei: a lone surrogate in the similarity source", "/similarity",
     b'{"inputs": {"source_sentence": "\\ud800", "sentences": ["b"]}}', JSON, 422, "Validation"),
    ("tei: a lone surrogate in prompt_name", "/embed", b'{"inputs": "a", "prompt_name": "\\ud800"}', JSON, 422,
     "Validation"),
    ("openai: a lone surrogate in user", "/v1/embeddings", b'{"input": "a", "user": "\\ud800"}', JSON, 400,
     "invalid_request_error"),
    ("root: a lone surrogate in a fill-mask target", "/", b'{"inputs": "a [MASK]", "parameters": {"targets": '
     b'"\\ud800"}}', JSON, 422, "Validation"),
    ("a lone surrogate as a field name", "/encode", b'{"inputs": "a", "\\ud800": 1}', JSON, 422, "validation"),
    ("a UTF-8 byte order mark", "/encode", b'\xef\xbb\xbf{"inputs": "a"}', JSON, 200, None),
    ("a UTF-16 body", "/encode", '{"inputs": "a"}'.encode("utf-16"), JSON, 422, "validation"),
    # Content-Encoding: gzip and deflate are read (their inflated size under the body limit), others are 415
    ("a gzip body", "/encode", gzip.compress(b'{"inputs": "a crane"}'), GZIP, 200, None),
    ("a deflate body", "/nsp", zlib.compress(b'{"inputs": ["a", "b"]}'), {**JSON, "content-encoding": "deflate"},
     200, None),
    ("tei: a gzip body", "/embed", gzip.compress(b'{"inputs": "a"}'), GZIP, 200, None),
    ("a gzip bomb", "/encode", ZIP_BOMB, GZIP, 413, "payload_too_large"),
    ("a body labelled gzip that is not", "/encode", b'{"inputs": "a"}', GZIP, 422, "validation"),
    ("a brotli body", "/encode", b'{"inputs": "a"}', {**JSON, "content-encoding": "br"}, 415,
     "unsupported_media_type"),
    ("openai: an unknown coding", "/v1/embeddings", b'{"input": "a"}', {**JSON, "content-encoding": "foo"}, 415,
     "invalid_request_error"),
    ("tei: an unknown coding", "/embed", b'{"inputs": "a"}', {**JSON, "content-encoding": "foo"}, 415, "Validation"),
]


def kind_of(body: dict) -> str | None:
    """The error kind in our and TEI's shape (`error_type`) or OpenAI's (`error.type`)."""
    error = body.get("error")
    return error.get("type") if isinstance(error, dict) else body.get("error_type")


def message_of(body: dict) -> str:
    error = body["error"]
    return error["message"] if isinstance(error, dict) else error


async def test_nasty_inputs_get_their_documented_answers(tiny_checkpoint):
    async with serving(tiny_checkpoint, max_body_bytes=2 * 1024 * 1024) as client:
        path, payload = WELL_FORMED
        before = (await client.post(path, json=payload)).json()
        failures = []
        for name, route, body, headers, status, error_type in CASES:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = await client.post(route, content=content, headers=headers)
            got = (response.status_code, kind_of(response.json()) if response.status_code != 200 else None)
            if got != (status, error_type):
                failures.append(f"{name}: expected {(status, error_type)}, got {got}: {response.text[:200]}")
            elif status != 200:
                body_json = response.json()
                assert set(body_json) in ({"error", "error_type"}, {"error"}) and message_of(body_json), name
                assert "Traceback" not in message_of(body_json) and "/tmp" not in message_of(body_json), name
        assert not failures, "\n".join(failures)
        assert (await client.post(path, json=payload)).json() == before
        assert (await client.get("/health")).status_code == 200
