"""The output directory: Parquet shards written atomically, rejects files, the manifest, and what is done.

    manifest.json                      the job: settings identity, model identity, inputs, plan; at the end the
                                       rows of every shard, the totals and "complete": true
    shards/part-FFFFF-RRRRRRRRRRRR.parquet   one per work unit (corpus.plan), the unit's name as its stem
    rejects/part-....jsonl             a unit's rejected rows with their reason (only when it had some)

A unit is done exactly when its shard exists under its final name. Every file is written under a `.tmp-` name in
its own folder, flushed to disk (fsync), then renamed, and the folder fsynced: a crash leaves either the whole
file or a `.tmp-` file, which the next run removes. A unit's rejects file is renamed before its shard, so a done
unit always has its rejects beside it.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus.errors import CorpusError, Rejected

MANIFEST = "manifest.json"
SHARDS, REJECTS = "shards", "rejects"
TMP_PREFIX = ".tmp-"
RESUME_HINT = "free some space, then run the same command again: it resumes where it stopped"


def shard_schema(dimensions: int, output_precision: str, chunked: bool) -> pa.Schema:
    """id: string, embedding: fixed_size_list<float32|float16>[dimensions], tokens: int32; chunked adds the chunk's
    index in its document and its character span (id is then the document's id)."""
    value = pa.float16() if output_precision == "float16" else pa.float32()
    columns = [pa.field("id", pa.string(), nullable=False),
               pa.field("embedding", pa.list_(pa.field("item", value, nullable=False), dimensions), nullable=False),
               pa.field("tokens", pa.int32(), nullable=False)]
    if chunked:
        columns += [pa.field("chunk", pa.int32(), nullable=False), pa.field("char_start", pa.int32(), nullable=False),
                    pa.field("char_end", pa.int32(), nullable=False)]
    return pa.schema(columns)


def shard_table(schema: pa.Schema, ids: list[str], vectors: np.ndarray, tokens: list[int],
                chunks: tuple[list[int], list[int], list[int]] | None = None) -> pa.Table:
    """A shard's rows: `vectors` (n, dimensions) float32, cast to the schema's embedding type."""
    embedding_type = schema.field("embedding").type
    flat = np.ascontiguousarray(vectors, dtype=embedding_type.value_type.to_pandas_dtype()).reshape(-1)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=embedding_type.value_type),
                                                  embedding_type.list_size)
    columns = [pa.array(ids, pa.string()), embedding, pa.array(tokens, pa.int32())]
    if chunks is not None:
        columns += [pa.array(values, pa.int32()) for values in chunks]
    return pa.Table.from_arrays(columns, schema=schema)


# ---- atomic files ------------------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _atomic_write(final: Path, write, before_rename=None) -> None:
    """`write(path)` into a `.tmp-` file beside `final`, fsync it, rename it to `final`, fsync the folder. Any
    error removes the temporary file; a full disk becomes a CorpusError naming the file."""
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}")
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        if before_rename is not None:
            before_rename(final)
        os.replace(tmp, final)
        _fsync_directory(final.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CorpusError(str(final), "no space left on the device", RESUME_HINT) from None
        if isinstance(exc, OSError):
            raise CorpusError(str(final), f"cannot write: {exc.strerror or exc}",
                              "check the output directory, then run the same command again") from None
        raise


def _write_text(final: Path, text: str) -> None:
    def write(path: Path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    _atomic_write(final, write)


def shard_path(output_dir: str | Path, unit_name: str) -> Path:
    return Path(output_dir) / SHARDS / f"{unit_name}.parquet"


def rejects_path(output_dir: str | Path, unit_name: str) -> Path:
    return Path(output_dir) / REJECTS / f"{unit_name}.jsonl"


def write_shard(output_dir: str | Path, unit, table: pa.Table, rejects: list[Rejected], before_rename=None) -> None:
    """The unit's rejects file (when it has rejects), then its shard: each atomically. A unit redone after a crash
    overwrites whatever rejects file it left."""
    if rejects:
        lines = "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in rejects)
        _write_text(rejects_path(output_dir, unit.name), lines)
    else:
        rejects_path(output_dir, unit.name).unlink(missing_ok=True)  # left by an earlier try under --on-error skip
    _atomic_write(shard_path(output_dir, unit.name), lambda path: pq.write_table(table, path), before_rename)


def prepare_output(output_dir: str | Path) -> int:
    """Create the folders; remove the `.tmp-` files a killed run left. Returns how many were removed."""
    root = Path(output_dir)
    removed = 0
    for folder in (root, root / SHARDS, root / REJECTS):
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{TMP_PREFIX}*"):
            stale.unlink(missing_ok=True)
            removed += 1
    return removed


def done_units(output_dir: str | Path) -> set[str]:
    """Names of the units whose shard exists under its final name."""
    folder = Path(output_dir) / SHARDS
    return {path.stem for path in folder.glob("part-*.parquet")} if folder.is_dir() else set()


# ---- the manifest ------------------------------------------------------------------------------


def read_manifest(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorpusError(str(path), f"unreadable manifest: {exc}",
                          "this directory holds no job this command made; choose an empty --output") from None
    if not isinstance(manifest, dict) or "identity" not in manifest:
        raise CorpusError(str(path), "not a manifest of python -m corpus", "choose an empty --output")
    return manifest


def write_manifest(output_dir: str | Path, manifest: dict) -> None:
    _write_text(Path(output_dir) / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def check_manifest(output_dir: str | Path, manifest: dict, identity: dict, model_identity: dict,
                   inputs: list[dict]) -> None:
    """Refuse to resume into a directory another job made: the first differing option, the model, or an input
    added, removed or changed since, each named."""
    where = str(Path(output_dir) / MANIFEST)
    other = "use another --output, or the same options as the run that made it"
    for name in sorted(set(identity) | set(manifest["identity"])):
        was, now = manifest["identity"].get(name), identity.get(name)
        if was != now:
            flag = "--" + name.replace("_", "-")
            raise CorpusError(where, f"this output was made with {flag} {_shown(was)}, this run asks for "
                                     f"{_shown(now)}", other)
    if manifest.get("model") != model_identity:
        raise CorpusError(where, f"this output was made with another model ({_model_name(manifest.get('model'))}; "
                                 f"this run loads {_model_name(model_identity)})",
                          "use another --output, or the same --checkpoint as the run that made it")
    before = {entry["uri"]: entry for entry in manifest.get("inputs", [])}
    now_by_uri = {entry["uri"]: entry for entry in inputs}
    for uri in sorted(set(before) | set(now_by_uri)):
        if uri not in now_by_uri:
            raise CorpusError(uri, "this input was part of the job and is gone",
                              "restore it, or start the job again in an empty --output")
        if uri not in before:
            raise CorpusError(uri, "this input is new since the job started",
                              "embed it into another --output, or start the job again in an empty one")
        if before[uri]["fingerprint"] != now_by_uri[uri]["fingerprint"]:
            raise CorpusError(uri, "this input changed since the job started (size or modification time)",
                              "restore it, or start the job again in an empty --output")


def _shown(value) -> str:
    return "(not set)" if value is None else json.dumps(value) if not isinstance(value, str) else value


def _model_name(identity: dict | None) -> str:
    if not identity:
        return "unknown"
    if identity.get("hub_id"):
        return f"{identity['hub_id']}@{identity.get('commit') or identity.get('revision')}"
    return f"{identity.get('checkpoint')}, weights sha256 {str(identity.get('weights_sha256'))[:12]}"


def completed(output_dir: str | Path, manifest: dict, unit_names: list[str]) -> dict:
    """The manifest of a finished job: every shard's rows (read from its Parquet footer) and rejects, the totals,
    `complete: true`. Read from the files, so a job finished over several runs counts each row once."""
    shards, rows, rejected, tokens = [], 0, 0, 0
    for name in unit_names:
        path = shard_path(output_dir, name)
        metadata = pq.read_metadata(path)
        rejects_file = rejects_path(output_dir, name)
        rejects = sum(1 for _ in open(rejects_file, encoding="utf-8")) if rejects_file.is_file() else 0
        shard_tokens = _column_sum(path, "tokens")
        shards.append({"name": name, "rows": metadata.num_rows, "rejects": rejects, "tokens": shard_tokens})
        rows, rejected, tokens = rows + metadata.num_rows, rejected + rejects, tokens + shard_tokens
    return {**manifest, "shards": shards, "totals": {"rows": rows, "rejects": rejected, "tokens": tokens},
            "complete": True}


def _column_sum(path: Path, column: str) -> int:
    values = pq.read_table(path, columns=[column]).column(column)
    return int(pc.sum(values).as_py() or 0)
