"""`--long-input chunk`: a document longer than the model gets the vector the service's /embed answers for it with
`"long_input": "chunk"` (its windows in the job's batches, pooled, folded by their tokens), and a short one beside it the
vector it gets without the option; without the flag such a document is still a bad row; the choice is part of the job's
identity."""

from __future__ import annotations

import numpy as np
import pytest

from corpus.cli import main
from corpus.settings import DEFAULT_LONG_INPUT_OVERLAP
from tests.corpus.job_helpers import embed_args, manifest, read_output, sentences, write_jsonl
from tests.service.conftest import serving

LONG = " ".join(sentences(12, chars=400))  # far past the tiny model's 128 positions
TEXTS = [LONG, "a short one", LONG[: len(LONG) // 2], *sentences(6), LONG + " and a tail"]
OPTIONS = ("--id-column", "id", "--rows-per-shard", "4", "--dtype", "float32", "--long-input", "chunk")


def job_vectors(tmp_path, checkpoint, *options) -> np.ndarray:
    source = write_jsonl(tmp_path / "corpus.jsonl", TEXTS)
    output = tmp_path / "out"
    assert main(embed_args(source, output, checkpoint, *OPTIONS, *options)) == 0
    found = read_output(output)
    assert found["id"] == [f"doc-{i}" for i in range(len(TEXTS))]
    return found["embedding"]


async def embed_route(checkpoint, **body) -> np.ndarray:
    async with serving(checkpoint, long_input_overlap=7) as client:
        response = await client.post("/embed", json={"inputs": TEXTS, "long_input": "chunk", **body})
    assert response.status_code == 200, response.text
    return np.asarray(response.json(), dtype=np.float32)


@pytest.mark.anyio
@pytest.mark.parametrize("options, body", [
    ((), {}),
    (("--dimensions", "16", "--no-normalize"), {"dimensions": 16, "normalize": False}),
], ids=["default", "dimensions-not-normalized"])
async def test_vectors_equal_embed_with_long_input_chunk(tmp_path, tiny_checkpoint, options, body):
    ours = job_vectors(tmp_path, tiny_checkpoint, "--long-input-overlap", "7", *options)
    theirs = await embed_route(tiny_checkpoint, **body)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_without_the_flag_a_long_document_is_a_bad_row_naming_it(tmp_path, tiny_checkpoint, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", TEXTS)
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, "--id-column", "id")) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "corpus.jsonl:1: is " in message and "--long-input chunk reads it whole in windows" in message


def test_part_of_the_identity_and_refused_with_truncate(tmp_path, tiny_checkpoint, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", TEXTS)
    output = tmp_path / "out"
    assert main(embed_args(source, output, tiny_checkpoint, *OPTIONS)) == 0
    identity = manifest(output)["identity"]
    assert identity["long_input"] == "chunk" and identity["long_input_overlap"] == DEFAULT_LONG_INPUT_OVERLAP
    assert main(embed_args(source, output, tiny_checkpoint, *OPTIONS, "--long-input-overlap", "3")) == 1
    assert f"--long-input-overlap {DEFAULT_LONG_INPUT_OVERLAP}, this run asks for 3" in capsys.readouterr().err
    assert main(embed_args(source, output, tiny_checkpoint, "--id-column", "id", "--rows-per-shard", "4",
                           "--dtype", "float32")) == 1
    assert "--long-input chunk, this run asks for (not set)" in capsys.readouterr().err
    assert main(embed_args(source, tmp_path / "other", tiny_checkpoint, *OPTIONS, "--truncate")) == 2
    assert "--truncate and --long-input chunk exclude each other" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_an_output_made_before_the_flag_existed_resumes(tmp_path, tiny_checkpoint):
    """A default job's identity holds none of the new options, so a manifest written before them still matches."""
    from corpus.settings import JobSettings

    identity = JobSettings(input="in", output="out").identity()
    assert not {"long_input", "long_input_overlap", "multi_vector", "multi_vector_mode"} & set(identity)
