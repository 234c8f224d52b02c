"""What a work unit's files hold: its shard (a Parquet table of ids, vectors and token counts) and its rejects (one
JSON line per refused row). Where and how they are written: corpus.output."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus.errors import Rejected


def shard_schema(dimensions: int, output_precision: str, chunked: bool, multi_vector: bool = False) -> pa.Schema:
    """id: string, embedding: fixed_size_list<float32|float16>[dimensions], tokens: int32; chunked adds the chunk's
    index in its document and its character span (id is then the document's id). `multi_vector`: embedding is a list
    of such vectors, one per token vector of the row (list<fixed_size_list<...>[dimensions]>)."""
    value = pa.float16() if output_precision == "float16" else pa.float32()
    vector = pa.list_(pa.field("item", value, nullable=False), dimensions)
    embedding = pa.list_(pa.field("item", vector, nullable=False)) if multi_vector else vector
    columns = [pa.field("id", pa.string(), nullable=False),
               pa.field("embedding", embedding, nullable=False),
               pa.field("tokens", pa.int32(), nullable=False)]
    if chunked:
        columns += [pa.field("chunk", pa.int32(), nullable=False), pa.field("char_start", pa.int32(), nullable=False),
                    pa.field("char_end", pa.int32(), nullable=False)]
    return pa.schema(columns)


def shard_table(schema: pa.Schema, ids: list[str], vectors: np.ndarray | list[np.ndarray], tokens: list[int],
                spans: tuple[list[int], list[int], list[int]] | None = None) -> pa.Table:
    """A shard's rows: `vectors` (n, dimensions) float32, or a multi-vector schema's list of n (vectors, dimensions)
    arrays, cast to the schema's embedding type; `spans` are the chunk columns (chunk index, char_start, char_end)
    of a chunked job."""
    embedding_type = schema.field("embedding").type
    if pa.types.is_fixed_size_list(embedding_type):
        embedding = _vectors_array(embedding_type, vectors)
    else:  # one list of vectors per row: the rows' vectors end to end, cut at each row's count
        counts = np.fromiter((len(v) for v in vectors), dtype=np.int32, count=len(vectors))
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        width = embedding_type.value_type.list_size
        stacked = np.concatenate(vectors) if len(vectors) else np.empty((0, width), dtype=np.float32)
        embedding = pa.ListArray.from_arrays(offsets, _vectors_array(embedding_type.value_type, stacked),
                                             type=embedding_type)
    columns = [pa.array(ids, pa.string()), embedding, pa.array(tokens, pa.int32())]
    if spans is not None:
        columns += [pa.array(values, pa.int32()) for values in spans]
    return pa.Table.from_arrays(columns, schema=schema)


def _vectors_array(vector_type: pa.DataType, vectors: np.ndarray) -> pa.Array:
    """(n, dimensions) -> n vectors of `vector_type` (a fixed_size_list of float32 or float16)."""
    flat = np.ascontiguousarray(vectors, dtype=vector_type.value_type.to_pandas_dtype()).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=vector_type.value_type), type=vector_type)


def parquet_bytes(table: pa.Table) -> bytes:
    """The shard file's bytes, exactly what pq.write_table writes to a path."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def rejects_text(rejects: list[Rejected]) -> str:
    return "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rejects)


def token_total(table: pa.Table) -> int:
    return int(pc.sum(table.column("tokens")).as_py() or 0)
