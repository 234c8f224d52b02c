"""The corpus sent through our own HTTP `/embed`, as a user's client loop would before `python -m corpus`: read the
text file, send it in requests of `batch` inputs from `clients` keep-alive connections at once (so that the server's
batcher always has work), turn each JSON answer back into float32 vectors and write Parquet files of
`rows_per_file` rows (id, embedding), in the same shape as the sentence-transformers peer's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from bench.serving.http_client import Connection


async def _embed_all(url: str, texts: list[str], batch: int, clients: int) -> np.ndarray:
    starts = iter(range(0, len(texts), batch))
    answers: dict[int, np.ndarray] = {}

    async def client() -> None:
        async with Connection(url) as connection:
            for start in starts:  # shared: each request takes the next slice
                body = orjson.dumps({"inputs": texts[start : start + batch], "truncate": True})
                status, answer = await connection.request("POST", "/embed", body)
                if status != 200:
                    raise RuntimeError(f"/embed answered {status}: {answer[:300]!r}")
                answers[start] = np.asarray(orjson.loads(answer), dtype=np.float32)

    await asyncio.gather(*(client() for _ in range(clients)))
    return np.concatenate([answers[start] for start in sorted(answers)])


def embed_file(url: str, texts_path: Path, output: Path, batch: int = 32, clients: int = 4,
               rows_per_file: int = 10_000) -> tuple[int, float]:
    """(rows, seconds) from reading `texts_path` to the last Parquet file written."""
    started = time.perf_counter()
    texts = texts_path.read_text(encoding="utf-8").splitlines()
    vectors = asyncio.run(_embed_all(url, texts, batch, clients))
    output.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(texts), rows_per_file):
        part = vectors[start : start + rows_per_file]
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), part.shape[1])
        ids = pa.array([f"{texts_path.name}:{start + k + 1}" for k in range(len(part))])
        pq.write_table(pa.table({"id": ids, "embedding": embedding}), output / f"part-{start:012d}.parquet")
    return len(texts), time.perf_counter() - started
