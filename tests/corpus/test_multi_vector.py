"""`--multi-vector`: each row's vectors are what the service's /token-vectors answers for the same text in the same
mode (documents whole, cut under --truncate, in windows under --long-input chunk; queries marked and expanded), and so
what PyLate's and colbert-ai's encoders give (tests/service/frontend/test_colbert.py holds the route to transformers'
BertModel with the ColBERT rule, tests/test_colbert_reference.py to the libraries); float16 where asked; the choice is
part of the job's identity; a model that is no ColBERT is refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from corpus.cli import main
from tests.corpus.job_helpers import embed_args, manifest, read_vectors, sentences, write_jsonl
from tests.service.conftest import serving

# the tiny ColBERT reads documents of 24 tokens and queries of 16: most of these are longer
TEXTS = sentences(20, chars=120) + ["a", "The mill ( by the river ) ground wheat !", "x " * 40]
SHORT = ["a", "The mill ( by the river ) ground wheat !", "who built the old mill", "Bananas are yellow ."]
OPTIONS = ("--id-column", "id", "--rows-per-shard", "8", "--dtype", "float32", "--multi-vector")


def run_job(tmp_path, checkpoint, texts, *options, name="out") -> tuple[list[str], list[np.ndarray], list[int]]:
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    output = tmp_path / name
    assert main(embed_args(source, output, checkpoint, *OPTIONS, *options)) == 0
    return read_vectors(output)


async def route_vectors(checkpoint, texts, **body) -> list[np.ndarray]:
    async with serving(checkpoint, long_input_overlap=5) as client:
        response = await client.post("/token-vectors", json={"inputs": texts, **body})
    assert response.status_code == 200, response.text
    return [np.asarray(r["vectors"], dtype=np.float32) for r in response.json()["results"]]


def assert_same(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    assert len(ours) == len(theirs)
    for index, (mine, want) in enumerate(zip(ours, theirs)):
        assert mine.shape == want.shape, index
        np.testing.assert_allclose(mine, want, rtol=1e-5, atol=2e-5, err_msg=f"row {index}")


@pytest.mark.anyio
@pytest.mark.parametrize("layout", ["tiny_colbert", "tiny_colbert_ai"])
@pytest.mark.parametrize("options, body, texts", [
    (("--long-input", "chunk", "--long-input-overlap", "5"), {"long_input": "chunk"}, TEXTS),
    (("--truncate",), {"truncate": True}, TEXTS),
    ((), {}, SHORT),
    (("--multi-vector-mode", "query"), {"mode": "query"}, TEXTS),
], ids=["documents-in-windows", "documents-truncated", "documents", "queries"])
async def test_vectors_equal_the_token_vectors_route(tmp_path, layout, options, body, texts, request):
    checkpoint = request.getfixturevalue(layout)
    ids, ours, tokens = run_job(tmp_path, checkpoint, texts, *options)
    assert ids == [f"doc-{i}" for i in range(len(texts))]
    assert_same(ours, await route_vectors(checkpoint, texts, **body))
    assert all(count >= 2 for count in tokens)


@pytest.mark.anyio
async def test_float16_output_is_the_float32_vectors_rounded(tmp_path, tiny_colbert):
    texts = TEXTS[:6]
    _, full, _ = run_job(tmp_path, tiny_colbert, texts, "--truncate", name="full")
    _, half, _ = run_job(tmp_path, tiny_colbert, texts, "--truncate", "--output-precision", "float16", name="half")
    table = pq.read_table(next((tmp_path / "half" / "shards").glob("*.parquet")))
    assert str(table.schema.field("embedding").type.value_type.value_type) == "halffloat"
    for mine, want in zip(half, full):
        np.testing.assert_array_equal(mine, want.astype(np.float16).astype(np.float32))


def test_a_long_document_is_a_bad_row_unless_truncated_or_chunked(tmp_path, tiny_colbert, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", SHORT + [TEXTS[0]])
    assert main(embed_args(source, tmp_path / "out", tiny_colbert, *OPTIONS)) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"corpus.jsonl:{len(SHORT) + 1}: " in message and "reads at most 24" in message
    assert "--long-input chunk" in message and "--truncate" in message
    assert main(embed_args(source, tmp_path / "skipped", tiny_colbert, *OPTIONS, "--on-error", "skip")) == 0
    ids, _, _ = read_vectors(tmp_path / "skipped")
    assert ids == [f"doc-{i}" for i in range(len(SHORT))]
    rejects = [json.loads(line) for line in open(next((tmp_path / "skipped" / "rejects").glob("*.jsonl")))]
    assert [r["doc_id"] for r in rejects] == [f"doc-{len(SHORT)}"]


def test_a_model_that_is_no_colbert_is_refused_before_anything_is_written(tmp_path, tiny_checkpoint, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", SHORT)
    output = tmp_path / "out"
    assert main(embed_args(source, output, tiny_checkpoint, *OPTIONS)) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: --multi-vector needs a ColBERT checkpoint") and "\n" not in message
    assert not output.exists()


@pytest.mark.parametrize("flags, named", [
    (("--dimensions", "8"), "--dimensions"),
    (("--pooling", "cls"), "--pooling"),
    (("--no-normalize",), "--no-normalize"),
    (("--chunk-tokens", "10"), "--chunk-tokens"),
    (("--multi-vector-mode", "query", "--long-input", "chunk"), "a query is always cut"),
])
def test_options_that_cannot_apply_to_token_vectors_are_refused(tmp_path, tiny_colbert, capsys, flags, named):
    source = write_jsonl(tmp_path / "corpus.jsonl", SHORT)
    assert main(embed_args(source, tmp_path / "out", tiny_colbert, *OPTIONS, *flags)) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_resumed_into_the_same_vectors_and_refused_with_another_mode(tmp_path, tiny_colbert, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", TEXTS)
    output = tmp_path / "out"
    args = embed_args(source, output, tiny_colbert, *OPTIONS, "--truncate")
    assert main(args) == 0
    whole = read_vectors(output)
    assert manifest(output)["identity"]["multi_vector"] is True
    assert manifest(output)["identity"]["multi_vector_mode"] == "document"
    # a run stopped after its first shards: the last shard gone, the manifest not complete yet
    shards = sorted((output / "shards").glob("*.parquet"))
    shards[-1].unlink()
    stopped = {**manifest(output), "complete": False}
    stopped.pop("shards"), stopped.pop("totals")
    (output / "manifest.json").write_text(json.dumps(stopped))
    assert main(args + ["--multi-vector-mode", "query"]) == 1
    assert "--multi-vector-mode document, this run asks for query" in capsys.readouterr().err
    without = [a for a in args if a != "--multi-vector"]
    assert main(without) == 1
    assert "--multi-vector true" in capsys.readouterr().err
    assert main(args) == 0
    resumed = read_vectors(output)
    assert resumed[0] == whole[0] and resumed[2] == whole[2]
    for mine, want in zip(resumed[1], whole[1]):
        np.testing.assert_array_equal(mine, want)
    assert manifest(output)["complete"]
