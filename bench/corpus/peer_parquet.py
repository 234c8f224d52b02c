"""The Parquet output both in-environment peers write (st_peer.py, fastembed_peer.py): a text file, one document a
line, embedded in slices of `rows_per_file` lines, each slice one Parquet file of (id, embedding) rows. The peers run
as scripts in their own virtual environment, which imports them from this folder: this module needs only numpy and
pyarrow, and nothing from this repository."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def embed_file(embed: Callable[[list[str]], object], texts_path: Path, output: Path, rows_per_file: int) -> int:
    """Read `texts_path`, embed every line with `embed` (a slice of texts -> a (rows, dim) array), write Parquet
    files of `rows_per_file` rows (id, embedding); returns the number of lines."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = texts_path.read_text(encoding="utf-8").splitlines()
    output.mkdir(parents=True, exist_ok=True)
    stem = texts_path.name  # ids as python -m corpus makes them for a text file: name:line
    for start in range(0, len(texts), rows_per_file):
        part = texts[start : start + rows_per_file]
        vectors = np.ascontiguousarray(embed(part), dtype=np.float32)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
        ids = pa.array([f"{stem}:{start + k + 1}" for k in range(len(part))])
        pq.write_table(pa.table({"id": ids, "embedding": embedding}), output / f"part-{start:012d}.parquet")
    return len(texts)
