"""How well a served checkpoint's sentence embeddings keep all-MiniLM-L6-v2's, measured as users get them:
the checkpoint behind `python -m service`, 400 held-out sentences (WikiText-2 test, detokenized) through
POST /v1/embeddings; the reference is all-MiniLM-L6-v2 in transformers (mean pooling, normalized, as its
sentence-transformers config says). Reports nearest-neighbour agreement, the rank correlation of all
pairwise similarities, and the mean cosine to the reference (when the widths match).

    python -m bench.quality.embedding_retention checkpoints/minilm-wikipedia
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import httpx
import numpy as np
import torch
import transformers

from devkit.paths import WIKITEXT_TEST, minilm_dir
from devkit.server import start_service
from trainer.retention import RETENTION_SEED, retention_metrics

SENTENCES = 400


def detokenize(line: str) -> str:
    """WikiText's spacing back to plain text ("a @-@ b" -> "a-b", "word ," -> "word,")."""
    line = re.sub(r" @(.)@ ", r"\1", line)
    line = re.sub(r" ([.,;:!?)'%])", r"\1", line)
    line = re.sub(r"([($]) ", r"\1", line)
    return line.replace(" n't", "n't").replace(" 's", "'s")


def held_out_sentences(count: int = SENTENCES) -> list[str]:
    sentences = []
    for line in WIKITEXT_TEST.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        sentences += [s.strip() for s in re.split(r"(?<= \.) ", line)
                      if 6 <= len(s.split()) <= 40 and "<unk>" not in s]
    random.Random(RETENTION_SEED).shuffle(sentences)
    return [detokenize(s) for s in dict.fromkeys(sentences)][:count]


def reference_vectors(texts: list[str]) -> np.ndarray:
    directory = minilm_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory).eval()
    rows = []
    for start in range(0, len(texts), 64):
        batch = tokenizer(texts[start : start + 64], padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        rows.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(rows).numpy()


def served_vectors(checkpoint: Path, texts: list[str], *flags: str) -> np.ndarray:
    process, url = start_service(checkpoint, *flags)
    try:
        rows = []
        for start in range(0, len(texts), 64):
            response = httpx.post(url + "/v1/embeddings", json={"input": texts[start : start + 64]}, timeout=120)
            response.raise_for_status()
            rows += [d["embedding"] for d in response.json()["data"]]
        return np.asarray(rows, dtype=np.float64)
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    args = parser.parse_args()
    texts = held_out_sentences()
    reference = reference_vectors(texts)
    for checkpoint in args.checkpoints:
        metrics = retention_metrics(served_vectors(checkpoint, texts), reference)
        print(json.dumps({"checkpoint": checkpoint.name, **metrics}))


if __name__ == "__main__":
    main()
