"""ColBERT checkpoints built by PyLate and by colbert-ai themselves (all-MiniLM-L6-v2 and a small random BERT under
them), served here, against the libraries' own encoders on the same checkpoints (run in their environment,
requirements/colbert-reference.txt): every query's and document's vectors (cosine >= 0.99999 each) and every MaxSim
score (within 1e-4 of PyLate's colbert_scores of each document and of colbert-ai's colbert_score), through
/token-vectors and /v1/rerank. PyLate's rank.rerank scores documents padded with zero vectors to the longest of the
call: it counts a negative best similarity as 0 in the shorter ones, so there the service's scores may be lower."""

from __future__ import annotations

import os

import numpy as np
import pytest

from devkit import colbert_reference
from devkit.paths import minilm_dir
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
QUERIES = ["when was the tower built ?", "who wrote the play", "rivers of europe"]
DOCUMENTS = [
    "The tower was built in 1889 for the World's Fair; it stood 300 m tall.",
    "Hamlet (a tragedy) was written by William Shakespeare around 1600!",
    "The Danube and the Rhine are two of Europe's longest rivers.",
    "Completely unrelated: a recipe for bread - flour, water, salt & yeast.",
    " ".join(f"Chapter {n}: the river flows past the tower, and the play goes on." for n in range(30)),  # cut
]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_checkpoint):
    """The checkpoints, each built by its library, and every library's encodings of them (one run of the reference)."""
    if not colbert_reference.PYTHON.is_file():
        if os.environ.get("BERT_REQUIRE_COLBERT_REFERENCE"):
            pytest.fail(f"{colbert_reference.PYTHON} is missing: `make test` installs it")
        pytest.skip(f"{colbert_reference.PYTHON} is missing (make test installs PyLate and colbert-ai there)")
    root = tmp_path_factory.mktemp("colbert-built")
    paths = {"pylate-minilm": root / "pylate-minilm", "pylate-tiny": root / "pylate-tiny",
             "colbert-ai-minilm": root / "colbert-ai-minilm"}
    builds = [
        {"command": "build_pylate", "base": str(minilm_dir()), "output": str(paths["pylate-minilm"]), "settings": {}},
        # a random BERT with PyLate's options away from their defaults: a biased projection of 40, short lengths,
        # expansion tokens attended to
        {"command": "build_pylate", "base": str(tiny_checkpoint), "output": str(paths["pylate-tiny"]),
         "settings": {"embedding_size": 40, "bias": True, "query_length": 20, "document_length": 48,
                      "attend_to_expansion_tokens": True, "seed": 7}},
        {"command": "build_colbert_ai", "base": str(minilm_dir()), "output": str(paths["colbert-ai-minilm"]),
         "settings": {"dim": 96, "query_maxlen": 24, "doc_maxlen": 64, "seed": 3}},
    ]
    encodes = [("pylate-minilm", "pylate"), ("pylate-tiny", "pylate"), ("colbert-ai-minilm", "colbert-ai"),
               ("colbert-ai-minilm", "pylate")]
    answer = colbert_reference.run(builds + [
        {"command": "encode", "checkpoint": str(paths[name]), "library": library, "queries": QUERIES,
         "documents": DOCUMENTS} for name, library in encodes], timeout_s=1200)
    assert answer["versions"]["pylate"] == "1.6.0" and answer["versions"]["transformers"].startswith("4.")
    return paths, dict(zip(encodes, answer["results"][len(builds):]))


def assert_same_vectors(ours: list, theirs: list, what: str) -> None:
    mine, want = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert mine.shape == want.shape, (what, mine.shape, want.shape)
    cosines = (mine * want).sum(1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.99999, (what, cosines.min())


@pytest.mark.parametrize("name, library", [("pylate-minilm", "pylate"), ("pylate-tiny", "pylate"),
                                           ("colbert-ai-minilm", "colbert-ai"), ("colbert-ai-minilm", "pylate")])
async def test_vectors_and_scores_equal_the_library_on_its_own_checkpoint(built, name, library):
    paths, references = built
    want = references[name, library]
    async with serving(paths[name]) as client:
        queries = (await client.post("/token-vectors", json={"inputs": QUERIES, "mode": "query"})).json()["results"]
        documents = (await client.post("/token-vectors", json={"inputs": DOCUMENTS, "truncate": True})).json()
        scores = []
        for query in QUERIES:
            ranked = (await client.post("/v1/rerank", json={"model": name, "query": query, "documents": DOCUMENTS,
                                                            "truncate": True})).json()["results"]
            scores.append([r["relevance_score"] for r in sorted(ranked, key=lambda r: r["index"])])
    for index, (mine, theirs) in enumerate(zip(queries, want["queries"])):
        assert_same_vectors(mine["vectors"], theirs, f"query {index}")
    for index, (mine, theirs) in enumerate(zip(documents["results"], want["documents"])):
        assert_same_vectors(mine["vectors"], theirs, f"document {index}")
    np.testing.assert_allclose(scores, want["scores"], atol=1e-4)
    assert np.ptp(want["scores"][0]) > 0.5  # the scores tell documents apart (a ranking, not ties)
    if "rank_scores" in want:  # PyLate's rank.rerank counts a negative best similarity as 0 in a padded document
        assert (np.asarray(scores) <= np.asarray(want["rank_scores"]) + 1e-4).all()
        longest = int(np.argmax([len(d) for d in want["documents"]]))  # never padded: the same score
        np.testing.assert_allclose(np.asarray(scores)[:, longest], np.asarray(want["rank_scores"])[:, longest],
                                   atol=1e-4)
