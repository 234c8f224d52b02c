"""Builds ColBERT checkpoints with PyLate and colbert-ai, and encodes and scores with them: the references of
tests/test_colbert_reference.py and bench/rerank. Runs in their own environment (.venv-colbert-reference,
requirements/colbert-reference.txt), which cannot share one with the service's.

    python tests/colbert_reference/drive.py < {"commands": [{"command": ..., ...}, ...]}

prints one JSON object: {"results": [one per command, in order], "versions": {...}}. Commands:
- build_pylate {base, output, settings}: PyLate's ColBERT on the encoder in `base` (a Hugging Face directory), its
  projection made by PyLate (`embedding_size`, `bias`) and its settings (`query_length`, ...), saved with
  `ColBERT.save`;
- build_colbert_ai {base, output, settings}: colbert-ai's ColBERT on `base` with a ColBERTConfig of `settings`,
  saved with its own `save` (HF_ColBERT weights, artifact.metadata);
- encode {checkpoint, library, queries, documents}: each query's and each document's vectors as the library's own
  encoder gives them (PyLate's `encode`, colbert-ai's `queryFromText` / `docFromText`), and the MaxSim score of every
  document for every query (`scores`: PyLate's `colbert_scores` of each document alone, colbert-ai's `colbert_score`
  of the padded, masked batch; and PyLate's `rank.rerank` as `rank_scores`);
- time_rerank {checkpoint, query, documents, repeats}: the seconds of each rerank in process (bench/rerank).
"""

from __future__ import annotations

import json
import sys

import numpy as np


def build_pylate(base: str, output: str, settings: dict) -> dict:
    import torch
    from pylate import models

    torch.manual_seed(settings.pop("seed", 0))
    model = models.ColBERT(base, device="cpu", **settings)
    model.save(output)
    return {"saved": output}


def build_colbert_ai(base: str, output: str, settings: dict) -> dict:
    import torch
    from colbert.infra import ColBERTConfig
    from colbert.modeling.colbert import ColBERT

    torch.manual_seed(settings.pop("seed", 0))
    model = ColBERT(name=base, colbert_config=ColBERTConfig(**settings))
    model.save(output)
    return {"saved": output}


def encode(checkpoint: str, library: str, queries: list[str], documents: list[str]) -> dict:
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if library == "pylate":
        from pylate import models, rank
        from pylate.scores import colbert_scores

        model = models.ColBERT(checkpoint, device="cpu")
        q = model.encode(queries, is_query=True, show_progress_bar=False)
        d = model.encode(documents, is_query=False, show_progress_bar=False)
        # Each document scored alone: padded beside longer ones, PyLate's scores (rank.rerank, and colbert_scores even
        # with documents_mask, which multiplies by it) count a query vector whose best similarity in the document is
        # negative as 0, so a document's score would depend on its neighbours; rank.rerank's are kept to show that.
        queries_tensor = torch.from_numpy(np.stack(q))
        scores = torch.stack([colbert_scores(queries_tensor, torch.from_numpy(x)[None])[:, 0] for x in d], 1).tolist()
        ranked = rank.rerank(documents_ids=[list(range(len(documents)))] * len(queries), queries_embeddings=q,
                             documents_embeddings=[d] * len(queries))
        rank_scores = [[0.0] * len(documents) for _ in queries]
        for row, found in enumerate(ranked):
            for entry in found:
                rank_scores[row][entry["id"]] = float(entry["score"])
        return {"queries": [v.tolist() for v in q], "documents": [v.tolist() for v in d], "scores": scores,
                "rank_scores": rank_scores}
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint
    from colbert.modeling.colbert import colbert_score

    ckpt = Checkpoint(checkpoint, colbert_config=ColBERTConfig(), verbose=0)
    q = ckpt.queryFromText(queries).float()  # (Q, query_maxlen, dim)
    d = ckpt.docFromText(documents, keep_dims=False)  # [(kept, dim)]
    d = [x.float() for x in d]
    padded = torch.nn.utils.rnn.pad_sequence(d, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(x), dtype=torch.bool) for x in d], batch_first=True)
    scores = [colbert_score(q[i : i + 1].expand(len(d), -1, -1), padded, mask.unsqueeze(-1),
                            ckpt.colbert_config).tolist() for i in range(len(queries))]
    return {"queries": [v.tolist() for v in q], "documents": [v.tolist() for v in d], "scores": scores}


def time_rerank(checkpoint: str, query: str, documents: list[str], repeats: int) -> dict:
    """Seconds of each of `repeats` reranks in this process, after one to warm up: PyLate's default CPU path, the
    query and the documents encoded (its default batch size), then rank.rerank."""
    import time

    import torch
    from pylate import models, rank

    model = models.ColBERT(checkpoint, device="cpu")
    seconds = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        q = model.encode([query], is_query=True, show_progress_bar=False)
        d = model.encode(documents, is_query=False, show_progress_bar=False)
        rank.rerank(documents_ids=[list(range(len(documents)))], queries_embeddings=q, documents_embeddings=[d])
        seconds.append(time.perf_counter() - started)
    return {"seconds": seconds[1:], "threads": torch.get_num_threads()}


COMMANDS = {"build_pylate": build_pylate, "build_colbert_ai": build_colbert_ai, "encode": encode,
            "time_rerank": time_rerank}


def main() -> None:
    results = []
    for command in json.load(sys.stdin)["commands"]:
        command = dict(command)
        results.append(COMMANDS[command.pop("command")](**command))
    from importlib.metadata import version

    versions = {name: version(name) for name in ("pylate", "colbert-ai", "transformers", "torch")}
    print(json.dumps({"results": results, "versions": versions}))


if __name__ == "__main__":
    main()
