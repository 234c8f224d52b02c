"""The corpus job's vectors are the HTTP service's: /embed (TEI) for the same texts with the same options, /encode
for CLS pooling; within float rounding (a batch's other members change the last bits). Both in float32 (the
service's test helper serves float32; how `--dtype auto` resolves is tests/service/engine/test_auto_precision.py's
and tests/corpus/test_resume.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from corpus.cli import main
from tests.corpus.job_helpers import embed_args, read_output, sentences, write_jsonl
from tests.service.conftest import serving

TEXTS = sentences(40) + ["a", "The cat sat on the mat .", "x " * 60]
LONG = " ".join(sentences(12, chars=400))  # far past the tiny model's 128 positions


def corpus_vectors(tmp_path, checkpoint, texts, *options) -> np.ndarray:
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    output = tmp_path / "out"
    assert main(embed_args(source, output, checkpoint, "--id-column", "id", "--rows-per-shard", "16",
                           "--dtype", "float32", *options)) == 0
    found = read_output(output)
    assert found["id"] == [f"doc-{i}" for i in range(len(texts))]
    return found["embedding"]


async def http_vectors(checkpoint, texts, route="/embed", **body) -> np.ndarray:
    async with serving(checkpoint) as client:
        vectors = []
        for start in range(0, len(texts), 32):
            response = await client.post(route, json={"inputs": texts[start : start + 32], **body})
            assert response.status_code == 200, response.text
            answer = response.json()
            vectors += answer if route == "/embed" else [r["embedding"] for r in answer["results"]]
    return np.asarray(vectors, dtype=np.float32)


@pytest.mark.anyio
@pytest.mark.parametrize("options, body", [
    ((), {}),
    (("--no-normalize",), {"normalize": False}),
    (("--dimensions", "16"), {"dimensions": 16}),
    (("--dimensions", "16", "--no-normalize"), {"dimensions": 16, "normalize": False}),
], ids=["default", "not-normalized", "dimensions", "dimensions-not-normalized"])
async def test_vectors_equal_embed(tmp_path, tiny_checkpoint, options, body):
    ours = corpus_vectors(tmp_path, tiny_checkpoint, TEXTS, *options)
    theirs = await http_vectors(tiny_checkpoint, TEXTS, **body)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.anyio
async def test_truncated_vectors_equal_embed_with_truncate(tmp_path, tiny_checkpoint):
    texts = TEXTS[:5] + [LONG]
    ours = corpus_vectors(tmp_path, tiny_checkpoint, texts, "--truncate")
    theirs = await http_vectors(tiny_checkpoint, texts, truncate=True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.anyio
async def test_cls_pooling_equals_encode_with_cls(tmp_path, tiny_checkpoint):
    ours = corpus_vectors(tmp_path, tiny_checkpoint, TEXTS, "--pooling", "cls")
    theirs = await http_vectors(tiny_checkpoint, TEXTS, route="/encode", pooling="cls", normalize=True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
